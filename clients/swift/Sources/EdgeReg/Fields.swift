import Foundation

/// The field rules of the wire formats (docs/protocol.md §3), each written once.
enum Fields {
    static let maxSafeInteger: Int64 = 9_007_199_254_740_991

    static func isLower(_ c: UInt8) -> Bool { c >= 97 && c <= 122 }
    static func isUpper(_ c: UInt8) -> Bool { c >= 65 && c <= 90 }
    static func isDigit(_ c: UInt8) -> Bool { c >= 48 && c <= 57 }
    static func isHexLower(_ c: UInt8) -> Bool { isDigit(c) || (c >= 97 && c <= 102) }
    static func isAlnum(_ c: UInt8) -> Bool { isLower(c) || isUpper(c) || isDigit(c) }

    /// `^[a-z][a-z0-9_-]{0,62}$`: a model, tier or variant name.
    static func isName(_ s: String) -> Bool {
        let b = Array(s.utf8)
        guard (1...63).contains(b.count), isLower(b[0]) else { return false }
        return b.dropFirst().allSatisfy { isLower($0) || isDigit($0) || $0 == 95 || $0 == 45 }
    }

    /// `^[a-z0-9][a-z0-9_-]{0,31}$`: a CPU feature name (a pattern, not a list: a feature
    /// named later never makes an older client refuse the manifest).
    static func isCPUFeature(_ s: String) -> Bool {
        let b = Array(s.utf8)
        guard (1...32).contains(b.count), isLower(b[0]) || isDigit(b[0]) else { return false }
        return b.dropFirst().allSatisfy { isLower($0) || isDigit($0) || $0 == 95 || $0 == 45 }
    }

    /// The largest memory figure any document carries, in MiB (1 TiB).
    static let maxMemoryMB: Double = 1_048_576

    /// `^[a-z][a-z0-9_]{0,62}$`: a task kind.
    static func isTaskKind(_ s: String) -> Bool {
        let b = Array(s.utf8)
        guard (1...63).contains(b.count), isLower(b[0]) else { return false }
        return b.dropFirst().allSatisfy { isLower($0) || isDigit($0) || $0 == 95 }
    }

    /// `^[A-Za-z_][A-Za-z0-9_]{0,63}$`: a named dynamic axis.
    static func isDimName(_ s: String) -> Bool {
        let b = Array(s.utf8)
        guard (1...64).contains(b.count), isLower(b[0]) || isUpper(b[0]) || b[0] == 95 else { return false }
        return b.dropFirst().allSatisfy { isAlnum($0) || $0 == 95 }
    }

    static func isHex(_ s: String, min: Int, max: Int) -> Bool {
        let b = Array(s.utf8)
        return (min...max).contains(b.count) && b.allSatisfy(isHexLower)
    }

    static func isSha256(_ s: String) -> Bool { isHex(s, min: 64, max: 64) }
    static func isSalt(_ s: String) -> Bool { isHex(s, min: 8, max: 64) }

    static func blobPath(_ sha256: String) -> String { "blobs/sha256/" + sha256 }

    static func isBlobPath(_ s: String) -> Bool {
        s.hasPrefix("blobs/sha256/") && isSha256(String(s.dropFirst(13)))
    }

    /// `^[0-9]+(\.[0-9A-Za-z]+)*$`: a runtime, app or OS version like 3.6.1.
    static func isDottedVersion(_ s: String) -> Bool {
        let parts = s.split(separator: ".", omittingEmptySubsequences: false)
        guard let first = parts.first, !first.isEmpty, first.utf8.allSatisfy(isDigit) else { return false }
        return parts.dropFirst().allSatisfy { !$0.isEmpty && $0.utf8.allSatisfy(isAlnum) }
    }

    /// Code points, as the reference counts a string's length.
    static func length(_ s: String) -> Int { s.unicodeScalars.count }

    /// `^(https?://[!-~]+|[A-Za-z0-9][A-Za-z0-9._/-]*)$`, at most 2048 characters: printable
    /// ASCII but the space after the scheme, the same in every engine (docs/protocol.md §3,
    /// "Patterns"; Swift's `isWhitespace` took U+0085 and not U+FEFF, like Python's `\s`).
    static func isReportURL(_ s: String) -> Bool {
        guard length(s) <= 2048, !s.isEmpty else { return false }
        for scheme in ["http://", "https://"] where s.hasPrefix(scheme) {
            let rest = s.dropFirst(scheme.count)
            if !rest.isEmpty, rest.unicodeScalars.allSatisfy({ (0x21...0x7E).contains($0.value) }) { return true }
        }
        let b = Array(s.utf8)
        guard isAlnum(b[0]) else { return false }
        return b.allSatisfy { isAlnum($0) || $0 == 46 || $0 == 95 || $0 == 47 || $0 == 45 }
    }
}

// MARK: - semantic versions

/// A Semantic Versioning 2.0.0 version (https://semver.org).
struct SemVer: Comparable, Sendable {
    let major: UInt64, minor: UInt64, patch: UInt64
    let pre: [Substring]

    init?(_ text: String) {
        var main = Substring(text)
        if let plus = main.firstIndex(of: "+") {
            let build = main[main.index(after: plus)...]
            let ids = build.split(separator: ".", omittingEmptySubsequences: false)
            guard ids.allSatisfy({ !$0.isEmpty && $0.utf8.allSatisfy { Fields.isAlnum($0) || $0 == 45 } }) else { return nil }
            main = main[..<plus]
        }
        var preIDs: [Substring] = []
        if let dash = main.firstIndex(of: "-") {
            let pre = main[main.index(after: dash)...]
            preIDs = pre.split(separator: ".", omittingEmptySubsequences: false)
            for id in preIDs {
                guard !id.isEmpty, id.utf8.allSatisfy({ Fields.isAlnum($0) || $0 == 45 }) else { return nil }
                if id.utf8.allSatisfy(Fields.isDigit), id.count > 1, id.first == "0" { return nil }
            }
            main = main[..<dash]
        }
        let nums = main.split(separator: ".", omittingEmptySubsequences: false)
        guard nums.count == 3 else { return nil }
        var values: [UInt64] = []
        for n in nums {
            guard !n.isEmpty, n.utf8.allSatisfy(Fields.isDigit), n == "0" || n.first != "0", let v = UInt64(n) else { return nil }
            values.append(v)
        }
        (major, minor, patch, pre) = (values[0], values[1], values[2], preIDs)
    }

    static func < (a: SemVer, b: SemVer) -> Bool {
        if (a.major, a.minor, a.patch) != (b.major, b.minor, b.patch) {
            return (a.major, a.minor, a.patch) < (b.major, b.minor, b.patch)
        }
        // A release sorts after its pre-releases; numeric identifiers below text ones.
        if a.pre.isEmpty || b.pre.isEmpty { return !a.pre.isEmpty && b.pre.isEmpty }
        for (x, y) in zip(a.pre, b.pre) where x != y {
            let xn = x.utf8.allSatisfy(Fields.isDigit), yn = y.utf8.allSatisfy(Fields.isDigit)
            switch (xn, yn) {
            case (true, true):
                if x.count != y.count { return x.count < y.count }
                return x < y
            case (true, false): return true
            case (false, true): return false
            case (false, false): return Array(x.utf8).lexicographicallyPrecedes(Array(y.utf8))
            }
        }
        return a.pre.count < b.pre.count
    }

    static func == (a: SemVer, b: SemVer) -> Bool {
        (a.major, a.minor, a.patch) == (b.major, b.minor, b.patch) && a.pre == b.pre
    }
}

// MARK: - versions and ranges

/// App, OS and MNN runtime versions (docs/protocol.md §7, "Versions"):
/// `[v] number *("." part) ["-" pre] [build]`, ASCII, at most 64 characters.
struct Version: Comparable, Sendable {
    struct Part: Equatable {
        let number: [UInt8]  // digits without leading zeros: compared by length, then bytes
        let rest: [UInt8]
    }

    let core: [Part]
    let pre: [[UInt8]]

    init?(_ text: String) {
        var b = Array(text.utf8)
        guard !b.isEmpty, b.count <= 64, b.allSatisfy({ $0 < 0x80 }) else { return nil }
        func isIdent(_ c: UInt8) -> Bool { Fields.isAlnum(c) || c == 45 }
        // build: "+" 1*(alnum / "." / "-")  or  " (" 1*(alnum / "." / "-") ")"
        if let plus = b.firstIndex(of: 43) {
            let build = b[(plus + 1)...]
            guard !build.isEmpty, build.allSatisfy({ isIdent($0) || $0 == 46 }) else { return nil }
            b = Array(b[..<plus])
        } else if let open = b.firstIndex(of: 40) {
            guard open > 0, b[open - 1] == 32, b.last == 41, open + 1 < b.count - 1 else { return nil }
            let build = b[(open + 1)..<(b.count - 1)]
            guard build.allSatisfy({ isIdent($0) || $0 == 46 }) else { return nil }
            b = Array(b[..<(open - 1)])
        }
        var preIDs: [[UInt8]] = []
        if let dash = b.firstIndex(of: 45) {
            let pre = b[(dash + 1)...]
            guard !pre.isEmpty else { return nil }
            preIDs = pre.split(separator: 46, omittingEmptySubsequences: false).map(Array.init)
            guard preIDs.allSatisfy({ !$0.isEmpty && $0.allSatisfy(isIdent) }) else { return nil }
            b = Array(b[..<dash])
        }
        if let first = b.first, first == 118 || first == 86 { b.removeFirst() }  // v / V
        let parts = b.split(separator: 46, omittingEmptySubsequences: false)
        guard let head = parts.first, !head.isEmpty, head.allSatisfy(Fields.isDigit) else { return nil }
        var core: [Part] = []
        for part in parts {
            guard !part.isEmpty, part.allSatisfy(Fields.isAlnum) else { return nil }
            let digits = part.prefix { Fields.isDigit($0) }
            core.append(Part(number: Array(digits.drop { $0 == 48 }), rest: Array(part.dropFirst(digits.count))))
        }
        while let last = core.last, last.number.isEmpty, last.rest.isEmpty { core.removeLast() }
        self.core = core
        pre = preIDs
    }

    static func digitsLess(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        a.count != b.count ? a.count < b.count : a.lexicographicallyPrecedes(b)
    }

    static func partLess(_ a: Part, _ b: Part) -> Bool {
        if a.number != b.number { return digitsLess(a.number, b.number) }
        return a.rest.lexicographicallyPrecedes(b.rest)
    }

    static func < (a: Version, b: Version) -> Bool {
        let zero = Part(number: [], rest: [])
        for i in 0..<max(a.core.count, b.core.count) {
            let x = i < a.core.count ? a.core[i] : zero, y = i < b.core.count ? b.core[i] : zero
            if x != y { return partLess(x, y) }
        }
        if a.pre.isEmpty || b.pre.isEmpty { return !a.pre.isEmpty && b.pre.isEmpty }
        for (x, y) in zip(a.pre, b.pre) where x != y {
            let xn = x.allSatisfy(Fields.isDigit), yn = y.allSatisfy(Fields.isDigit)
            switch (xn, yn) {
            case (true, true):
                return digitsLess(Array(x.drop { $0 == 48 }), Array(y.drop { $0 == 48 }))
            case (true, false): return true
            case (false, true): return false
            case (false, false): return x.lexicographicallyPrecedes(y)
            }
        }
        return a.pre.count < b.pre.count
    }

    static func == (a: Version, b: Version) -> Bool { !(a < b) && !(b < a) }
}

enum DottedVersion {
    /// -1, 0 or 1; nil when either is not a version.
    static func compare(_ a: String, _ b: String) -> Int? {
        guard let va = Version(a), let vb = Version(b) else { return nil }
        return va < vb ? -1 : (vb < va ? 1 : 0)
    }

    /// The comparators of a range like `>=2.3.0, <3`, or nil when it is not a range.
    static func parseRange(_ text: String) -> [(String, Version)]? {
        guard !text.isEmpty, text.unicodeScalars.count <= 200 else { return nil }
        var out: [(String, Version)] = []
        for raw in text.split(separator: ",", omittingEmptySubsequences: false) {
            var part = Substring(raw)
            while part.first == " " { part = part.dropFirst() }
            var op = ""
            for candidate in [">=", "<=", "==", ">", "<"] where part.hasPrefix(candidate) {
                op = candidate
                break
            }
            guard !op.isEmpty else { return nil }
            part = part.dropFirst(op.count)
            while part.first == " " { part = part.dropFirst() }
            while part.last == " " { part = part.dropLast() }
            guard let version = Version(String(part)) else { return nil }
            out.append((op, version))
        }
        return out
    }

    /// True when `version` meets every comparator; nil when either does not parse.
    static func satisfies(_ version: String, _ range: String) -> Bool? {
        guard let comparators = parseRange(range), let v = Version(version) else { return nil }
        for (op, bound) in comparators {
            let c = v < bound ? -1 : (bound < v ? 1 : 0)
            let ok: Bool
            switch op {
            case ">=": ok = c >= 0
            case ">": ok = c > 0
            case "<=": ok = c <= 0
            case "<": ok = c < 0
            default: ok = c == 0
            }
            if !ok { return false }
        }
        return true
    }

    /// The versions/ vectors' result: a bad range is reported before a bad version.
    static func check(version: String, range: String) -> String {
        guard parseRange(range) != nil else { return "invalid-range" }
        guard Version(version) != nil else { return "invalid-version" }
        return satisfies(version, range) == true ? "match" : "no-match"
    }
}

// MARK: - times

/// UTC times on the wire: exactly `YYYY-MM-DDTHH:MM:SSZ` (docs/protocol.md §3).
public enum WireTime {
    /// Seconds since 1970 of a wire time, or nil when the spelling or the date is invalid.
    public static func parse(_ text: String) -> Int64? {
        let b = Array(text.utf8)
        guard b.count == 20, b[4] == 45, b[7] == 45, b[10] == 84, b[13] == 58, b[16] == 58, b[19] == 90 else { return nil }
        func num(_ r: Range<Int>) -> Int64? {
            var v: Int64 = 0
            for i in r {
                guard Fields.isDigit(b[i]) else { return nil }
                v = v * 10 + Int64(b[i] - 48)
            }
            return v
        }
        guard let y = num(0..<4), let mo = num(5..<7), let d = num(8..<10), let h = num(11..<13),
            let mi = num(14..<16), let s = num(17..<19)
        else { return nil }
        guard y >= 1, (1...12).contains(mo), h < 24, mi < 60, s < 60 else { return nil }
        let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
        let days = [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][Int(mo) - 1]
        guard d >= 1, d <= days else { return nil }
        return daysFromCivil(y, mo, d) * 86400 + h * 3600 + mi * 60 + s
    }

    /// Also accepts an RFC 3339 time with a fraction or an offset (the harness's `now`).
    public static func parseLenient(_ text: String) -> Int64? {
        if let t = parse(text) { return t }
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        if let date = formatter.date(from: text) { return Int64(date.timeIntervalSince1970.rounded(.down)) }
        formatter.formatOptions = [.withInternetDateTime]
        if let date = formatter.date(from: text) { return Int64(date.timeIntervalSince1970.rounded(.down)) }
        return nil
    }

    public static func format(_ seconds: Int64) -> String {
        let days = seconds >= 0 ? seconds / 86400 : (seconds - 86399) / 86400
        let rem = seconds - days * 86400
        let (y, m, d) = civilFromDays(days)
        return String(format: "%04lld-%02lld-%02lldT%02lld:%02lld:%02lldZ", y, m, d, rem / 3600, rem % 3600 / 60, rem % 60)
    }

    static func now() -> Int64 { Int64(Date().timeIntervalSince1970.rounded(.down)) }

    // Howard Hinnant's civil calendar algorithms.
    static func daysFromCivil(_ y0: Int64, _ m: Int64, _ d: Int64) -> Int64 {
        let y = m <= 2 ? y0 - 1 : y0
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146097 + doe - 719468
    }

    static func civilFromDays(_ z0: Int64) -> (Int64, Int64, Int64) {
        let z = z0 + 719468
        let era = (z >= 0 ? z : z - 146096) / 146097
        let doe = z - era * 146097
        let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365
        let y = yoe + era * 400
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let d = doy - (153 * mp + 2) / 5 + 1
        let m = mp < 10 ? mp + 3 : mp - 9
        return (m <= 2 ? y + 1 : y, m, d)
    }
}

// MARK: - percent

enum Percent {
    /// Basis points of a percent in [0, 100] with at most two decimals, or nil.
    static func basisPoints(_ percent: Double) -> Int? {
        guard percent.isFinite, percent >= 0, percent <= 100 else { return nil }
        let scaled = percent * 100
        let points = scaled.rounded(.toNearestOrEven)
        // percent * 100 is inexact in binary (0.29 * 100 = 28.999999999999996).
        guard abs(scaled - points) <= 1e-6 else { return nil }
        return Int(points)
    }
}
