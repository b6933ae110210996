// swift-tools-version:6.0
import PackageDescription

// On Apple platforms EdgeReg uses CryptoKit and URLSession; elsewhere (Linux,
// where it is built and tested here) libsodium (Ed25519) through the CSodium
// system library, OpenSSL's libcrypto (SHA-256) through CCrypto, and
// FoundationNetworking. See README.md, "Apple-only code paths".
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
        .systemLibrary(
            name: "CCrypto",
            pkgConfig: "libcrypto",
            providers: [.apt(["libssl-dev"])]
        ),
        .target(
            name: "EdgeReg",
            dependencies: [
                .target(name: "CSodium", condition: .when(platforms: [.linux])),
                .target(name: "CCrypto", condition: .when(platforms: [.linux])),
            ]
        ),
        // Test and device code, not in the library product: the socket transport a fleet
        // simulation binds to one address per device.
        .target(name: "EdgeRegTestSupport", dependencies: ["EdgeReg"]),
        .executableTarget(name: "EdgeRegDevice", dependencies: ["EdgeReg", "EdgeRegTestSupport"]),
        // docs/guides/ios.md's MNN runner with MNN behind a protocol, in no product: built (so
        // type-checked against ModelRunner/ModelSession) by `swift build` and `swift test`. The
        // Objective-C++ wrapper and its conformance need the Apple SDK and MNN: excluded.
        .target(
            name: "MNNRunnerExample",
            dependencies: ["EdgeReg"],
            path: "Examples/MNNRunner",
            exclude: ["MNNModel.h", "MNNModel.mm", "MNNModel+MNNNet.swift"]
        ),
        .testTarget(
            name: "EdgeRegTests",
            dependencies: ["EdgeReg", "EdgeRegTestSupport"]
        ),
    ],
    swiftLanguageModes: [.v6]
)
