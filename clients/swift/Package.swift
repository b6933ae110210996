// swift-tools-version:6.0
import PackageDescription

// On Apple platforms EdgeReg uses CryptoKit and URLSession; elsewhere (Linux,
// where it is built and tested here) libsodium through the CSodium system
// library and FoundationNetworking. See README.md, "Apple-only code paths".
let package = Package(
    name: "EdgeReg",
    platforms: [.iOS(.v16), .macOS(.v13)],
    products: [
        .library(name: "EdgeReg", targets: ["EdgeReg"]),
        .executable(name: "edgereg-device", targets: ["EdgeRegDevice"]),
    ],
    targets: [
        .systemLibrary(
            name: "CSodium",
            pkgConfig: "libsodium",
            providers: [.apt(["libsodium-dev"]), .brew(["libsodium"])]
        ),
        .target(
            name: "EdgeReg",
            dependencies: [.target(name: "CSodium", condition: .when(platforms: [.linux]))]
        ),
        .executableTarget(name: "EdgeRegDevice", dependencies: ["EdgeReg"]),
        .testTarget(
            name: "EdgeRegTests",
            dependencies: ["EdgeReg"]
        ),
    ],
    swiftLanguageModes: [.v6]
)
