import Foundation

/// The CPU features fit rule (e) reads, and the coarse class reports carry
/// (docs/protocol.md §7, "CPU features", and §11).
public enum CPUFeatures {
    /// Linux hwcap names (`/proc/cpuinfo` `Features`) -> the protocol's feature names.
    public static let hwcaps: [String: String] = [
        "asimddp": "dotprod", "asimdhp": "fp16", "fphp": "fp16", "i8mm": "i8mm", "bf16": "bf16", "sve2": "sve2",
        "sme": "sme",
    ]

    /// Apple's `sysctlbyname` keys -> the protocol's feature names (no Apple core has SVE2).
    public static let sysctls: [(key: String, feature: String)] = [
        ("hw.optional.arm.FEAT_DotProd", "dotprod"), ("hw.optional.arm.FEAT_FP16", "fp16"),
        ("hw.optional.arm.FEAT_I8MM", "i8mm"), ("hw.optional.arm.FEAT_BF16", "bf16"),
        ("hw.optional.arm.FEAT_SME", "sme"),
    ]

    /// Every name the protocol's table lists: all are ARM features.
    public static let armFeatures: Set<String> = Set(hwcaps.values)

    /// This device's features, read once: what `DeviceFacts` says by default.
    public static let detected: Set<String>? = detect()

    /// Read from the platform: `sysctlbyname` on iOS and macOS on arm64, `/proc/cpuinfo` on
    /// Linux aarch64, the empty set on x86_64 (no ARM feature applies). Nil when they cannot
    /// be read: rule (e) is then skipped, which an empty set would not be.
    public static func detect() -> Set<String>? {
        #if (os(iOS) || os(macOS)) && arch(arm64)
        var found = Set<String>()
        var readable = false
        for (key, feature) in sysctls {
            var value: Int32 = 0
            var size = MemoryLayout<Int32>.size
            // A key an older OS does not know (ENOENT) is a feature it does not have.
            guard sysctlbyname(key, &value, &size, nil, 0) == 0 else { continue }
            readable = true
            if value != 0 { found.insert(feature) }
        }
        return readable ? found : nil
        #elseif os(Linux) && arch(arm64)
        guard let data = FileManager.default.contents(atPath: "/proc/cpuinfo") else { return nil }
        return fromCPUInfo(String(decoding: data, as: UTF8.self))
        #elseif arch(x86_64)
        return []
        #else
        return nil
        #endif
    }

    /// The protocol's names in a `/proc/cpuinfo` text (every core's `Features` line, united);
    /// nil when it has no `Features` line (the features cannot be read from it).
    public static func fromCPUInfo(_ text: String) -> Set<String>? {
        var found = Set<String>()
        var sawFeatures = false
        for line in text.split(whereSeparator: \.isNewline) {
            guard let colon = line.firstIndex(of: ":") else { continue }
            guard line[..<colon].trimmingCharacters(in: .whitespaces).lowercased() == "features" else { continue }
            sawFeatures = true
            for word in line[line.index(after: colon)...].split(whereSeparator: { $0 == " " || $0 == "\t" }) {
                if let name = hwcaps[String(word)] { found.insert(name) }
            }
        }
        return sawFeatures ? found : nil
    }

    /// What this program was built for: `arm`, `x86_64` or `other`.
    public static var hostArch: String {
        #if arch(arm64) || arch(arm)
        return "arm"
        #elseif arch(x86_64)
        return "x86_64"
        #else
        return "other"
        #endif
    }

    /// The coarse class a report carries, never the features (docs/protocol.md §11): `armv9`
    /// with `i8mm` or `sve2`; `armv8.2` with `dotprod` or `fp16`; else `armv8` on ARM (the
    /// host, or a set that names an ARM feature: a simulated ARM device); `x86_64` on x86_64;
    /// `other` otherwise. Nil when the features were not said.
    public static func cpuClass(_ features: Set<String>?, arch: String = hostArch) -> String? {
        guard let features else { return nil }
        if features.contains("i8mm") || features.contains("sve2") { return "armv9" }
        if features.contains("dotprod") || features.contains("fp16") { return "armv8.2" }
        if arch == "arm" || !features.isDisjoint(with: armFeatures) { return "armv8" }
        if arch == "x86_64" { return "x86_64" }
        return "other"
    }
}
