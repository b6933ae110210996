import Foundation

/// A JSON number as written: integers keep their exact value (when it fits
/// 64 bits), every other spelling is a floating-point number.
public struct JSONNumber: Sendable, Equatable, Hashable {
    /// True for a literal without fraction or exponent (`9`, never `9.0` or `9e0`).
    public let isInteger: Bool
    /// The integer value, or nil when the literal is not an integer or does not fit 64 bits.
    public let int: Int64?
    /// The value as a double (what a float literal means).
    public let double: Double

    public init(int value: Int64) {
        isInteger = true
        int = value
        double = Double(value)
    }

    public init(double value: Double) {
        isInteger = false
        int = nil
        double = value
    }

    init(isInteger: Bool, int: Int64?, double: Double) {
        self.isInteger = isInteger
        self.int = int
        self.double = double
    }
}

/// An object with its keys in document order (duplicates are refused when parsing).
public struct JSONObject: Sendable, Equatable {
    public private(set) var keys: [String] = []
    public private(set) var values: [String: JSONValue] = [:]

    public init() {}

    public init(_ pairs: [(String, JSONValue)]) {
        for (key, value) in pairs { self[key] = value }
    }

    public subscript(key: String) -> JSONValue? {
        get { values[key] }
        set {
            if let newValue {
                if values.updateValue(newValue, forKey: key) == nil { keys.append(key) }
            } else if values.removeValue(forKey: key) != nil {
                keys.removeAll { $0 == key }
            }
        }
    }

    public var count: Int { keys.count }
}

/// A parsed JSON document.
public indirect enum JSONValue: Sendable, Equatable {
    case null
    case bool(Bool)
    case number(JSONNumber)
    case string(String)
    case array([JSONValue])
    case object(JSONObject)

    public static func int(_ value: Int64) -> JSONValue { .number(JSONNumber(int: value)) }
    public static func int(_ value: Int) -> JSONValue { .number(JSONNumber(int: Int64(value))) }
    public static func double(_ value: Double) -> JSONValue { .number(JSONNumber(double: value)) }

    public var objectValue: JSONObject? { if case .object(let o) = self { return o } else { return nil } }
    public var arrayValue: [JSONValue]? { if case .array(let a) = self { return a } else { return nil } }
    public var stringValue: String? { if case .string(let s) = self { return s } else { return nil } }
    public var boolValue: Bool? { if case .bool(let b) = self { return b } else { return nil } }
    public var isNull: Bool { if case .null = self { return true } else { return false } }
    /// The exact integer of an integer literal (never of `9.0`), else nil.
    public var intValue: Int64? {
        if case .number(let n) = self, n.isInteger { return n.int }
        return nil
    }
    /// Any number as a double (an integer literal too), else nil.
    public var doubleValue: Double? { if case .number(let n) = self { return n.double } else { return nil } }

    public subscript(key: String) -> JSONValue? { objectValue?[key] }

    /// A name for messages: "object", "array", "string", "number", "boolean", "null".
    public var kind: String {
        switch self {
        case .null: return "null"
        case .bool: return "boolean"
        case .number: return "number"
        case .string: return "string"
        case .array: return "array"
        case .object: return "object"
        }
    }
}

/// Why bytes are not strict JSON.
public struct JSONError: Error, Sendable, CustomStringConvertible {
    public let message: String
    public var description: String { message }
}

/// Strict JSON in (docs/protocol.md §2): UTF-8 only, no duplicate key, no NaN or
/// infinity (a literal too large for a double counts as one), nesting at most
/// `maxDepth` arrays and objects (checked before descending, so deep input cannot
/// exhaust the stack), nothing after the value but whitespace.
public enum StrictJSON {
    public static let maxDepth = 64

    public static func parse(_ data: Data, maxDepth: Int = StrictJSON.maxDepth) throws(JSONError) -> JSONValue {
        let bytes = [UInt8](data)
        return try parse(bytes: bytes, maxDepth: maxDepth)
    }

    public static func parse(bytes: [UInt8], maxDepth: Int = StrictJSON.maxDepth) throws(JSONError) -> JSONValue {
        // Whole-document UTF-8 validation first: a string slice is then always valid.
        guard isUTF8(bytes) else {
            throw JSONError(message: "not UTF-8")
        }
        var parser = Parser(bytes: bytes, maxDepth: maxDepth)
        parser.skipWhitespace()
        let value = try parser.parseValue(depth: 0)
        parser.skipWhitespace()
        if parser.pos != bytes.count {
            throw JSONError(message: "extra data at byte \(parser.pos)")
        }
        return value
    }

    /// Well-formed UTF-8 (RFC 3629): no overlong forms, no surrogates, nothing above U+10FFFF.
    static func isUTF8(_ b: [UInt8]) -> Bool {
        var i = 0
        while i < b.count {
            let c = b[i]
            if c < 0x80 {
                i += 1
                continue
            }
            let n: Int
            var low: UInt8 = 0x80, high: UInt8 = 0xBF
            switch c {
            case 0xC2...0xDF: n = 1
            case 0xE0: n = 2; low = 0xA0
            case 0xE1...0xEC, 0xEE...0xEF: n = 2
            case 0xED: n = 2; high = 0x9F  // U+D800..U+DFFF are not characters
            case 0xF0: n = 3; low = 0x90
            case 0xF1...0xF3: n = 3
            case 0xF4: n = 3; high = 0x8F
            default: return false
            }
            guard i + n < b.count else { return false }
            guard b[i + 1] >= low, b[i + 1] <= high else { return false }
            for k in stride(from: 2, through: n, by: 1) {
                guard b[i + k] >= 0x80, b[i + k] <= 0xBF else { return false }
            }
            i += n + 1
        }
        return true
    }

    /// True when the bytes are strict JSON (the device program's `check_json`).
    public static func isValid(_ data: Data) -> Bool {
        (try? parse(data)) != nil
    }

    struct Parser {
        let bytes: [UInt8]
        let maxDepth: Int
        var pos = 0

        init(bytes: [UInt8], maxDepth: Int) {
            self.bytes = bytes
            self.maxDepth = maxDepth
        }

        mutating func skipWhitespace() {
            while pos < bytes.count {
                switch bytes[pos] {
                case 0x20, 0x09, 0x0A, 0x0D: pos += 1
                default: return
                }
            }
        }

        func fail(_ message: String) -> JSONError {
            JSONError(message: "\(message) at byte \(pos)")
        }

        mutating func parseValue(depth: Int) throws(JSONError) -> JSONValue {
            guard pos < bytes.count else { throw fail("expected a value, found the end") }
            switch bytes[pos] {
            case UInt8(ascii: "{"):
                guard depth < maxDepth else { throw fail("nested more than \(maxDepth) levels deep") }
                return try parseObject(depth: depth + 1)
            case UInt8(ascii: "["):
                guard depth < maxDepth else { throw fail("nested more than \(maxDepth) levels deep") }
                return try parseArray(depth: depth + 1)
            case UInt8(ascii: "\""):
                return .string(try parseString().text)
            case UInt8(ascii: "t"):
                try literal("true")
                return .bool(true)
            case UInt8(ascii: "f"):
                try literal("false")
                return .bool(false)
            case UInt8(ascii: "n"):
                try literal("null")
                return .null
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
                return .number(try parseNumber())
            default:
                throw fail("unexpected character")
            }
        }

        mutating func literal(_ word: String) throws(JSONError) {
            let w = Array(word.utf8)
            guard pos + w.count <= bytes.count, Array(bytes[pos..<pos + w.count]) == w else {
                throw fail("unexpected character")
            }
            pos += w.count
        }

        mutating func parseObject(depth: Int) throws(JSONError) -> JSONValue {
            pos += 1
            var object = JSONObject()
            var seen = Set<[UInt16]>()
            skipWhitespace()
            if pos < bytes.count, bytes[pos] == UInt8(ascii: "}") {
                pos += 1
                return .object(object)
            }
            while true {
                skipWhitespace()
                guard pos < bytes.count, bytes[pos] == UInt8(ascii: "\"") else {
                    throw fail("expected a key")
                }
                let key = try parseString()
                // Compared as UTF-16 units: exact, whatever String's normalisation would say.
                guard seen.insert(key.units).inserted else {
                    throw fail("duplicate key \"\(key.text)\"")
                }
                skipWhitespace()
                guard pos < bytes.count, bytes[pos] == UInt8(ascii: ":") else { throw fail("expected ':'") }
                pos += 1
                skipWhitespace()
                let value = try parseValue(depth: depth)
                object[key.text] = value
                skipWhitespace()
                guard pos < bytes.count else { throw fail("unterminated object") }
                if bytes[pos] == UInt8(ascii: ",") {
                    pos += 1
                    continue
                }
                if bytes[pos] == UInt8(ascii: "}") {
                    pos += 1
                    return .object(object)
                }
                throw fail("expected ',' or '}'")
            }
        }

        mutating func parseArray(depth: Int) throws(JSONError) -> JSONValue {
            pos += 1
            var items: [JSONValue] = []
            skipWhitespace()
            if pos < bytes.count, bytes[pos] == UInt8(ascii: "]") {
                pos += 1
                return .array(items)
            }
            while true {
                skipWhitespace()
                items.append(try parseValue(depth: depth))
                skipWhitespace()
                guard pos < bytes.count else { throw fail("unterminated array") }
                if bytes[pos] == UInt8(ascii: ",") {
                    pos += 1
                    continue
                }
                if bytes[pos] == UInt8(ascii: "]") {
                    pos += 1
                    return .array(items)
                }
                throw fail("expected ',' or ']'")
            }
        }

        func hexValue(_ byte: UInt8) -> UInt16? {
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): return UInt16(byte - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): return UInt16(byte - UInt8(ascii: "a") + 10)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): return UInt16(byte - UInt8(ascii: "A") + 10)
            default: return nil
            }
        }

        mutating func parseString() throws(JSONError) -> (text: String, units: [UInt16]) {
            pos += 1
            var units: [UInt16] = []
            var surrogateEscape = false
            var runStart = pos
            func flush(_ end: Int) {
                if end > runStart {
                    units.append(contentsOf: String(decoding: bytes[runStart..<end], as: UTF8.self).utf16)
                }
            }
            while true {
                guard pos < bytes.count else { throw fail("unterminated string") }
                let byte = bytes[pos]
                if byte == UInt8(ascii: "\"") {
                    flush(pos)
                    pos += 1
                    break
                }
                if byte < 0x20 { throw fail("control character in a string") }
                if byte != UInt8(ascii: "\\") {
                    pos += 1
                    continue
                }
                flush(pos)
                pos += 1
                guard pos < bytes.count else { throw fail("unterminated string") }
                let escape = bytes[pos]
                pos += 1
                switch escape {
                case UInt8(ascii: "\""): units.append(0x22)
                case UInt8(ascii: "\\"): units.append(0x5C)
                case UInt8(ascii: "/"): units.append(0x2F)
                case UInt8(ascii: "b"): units.append(0x08)
                case UInt8(ascii: "f"): units.append(0x0C)
                case UInt8(ascii: "n"): units.append(0x0A)
                case UInt8(ascii: "r"): units.append(0x0D)
                case UInt8(ascii: "t"): units.append(0x09)
                case UInt8(ascii: "u"):
                    guard pos + 4 <= bytes.count else { throw fail("bad \\u escape") }
                    var code: UInt16 = 0
                    for i in 0..<4 {
                        guard let digit = hexValue(bytes[pos + i]) else { throw fail("bad \\u escape") }
                        code = code << 4 | digit
                    }
                    pos += 4
                    if code & 0xF800 == 0xD800 { surrogateEscape = true }
                    units.append(code)
                default:
                    throw fail("bad escape")
                }
                runStart = pos
            }
            // A lone surrogate escape ("\ud800", an unpaired "\udc00", a high one followed by
            // anything but a low one) is malformed (docs/protocol.md §2, RFC 8259 §8.2): no
            // Unicode text, and parsers disagree on what it reads as. Literal characters are
            // well-formed UTF-8, so their surrogates always come in pairs.
            if surrogateEscape {
                var i = 0
                while i < units.count {
                    let unit = units[i]
                    if unit & 0xFC00 == 0xD800, i + 1 < units.count, units[i + 1] & 0xFC00 == 0xDC00 {
                        i += 2
                        continue
                    }
                    if unit & 0xF800 == 0xD800 {
                        throw fail("lone surrogate escape \\u\(String(unit, radix: 16)) in a string")
                    }
                    i += 1
                }
            }
            return (String(decoding: units, as: UTF16.self), units)
        }

        mutating func parseNumber() throws(JSONError) -> JSONNumber {
            let start = pos
            if bytes[pos] == UInt8(ascii: "-") { pos += 1 }
            guard pos < bytes.count else { throw fail("bad number") }
            func isDigit(_ b: UInt8) -> Bool { b >= UInt8(ascii: "0") && b <= UInt8(ascii: "9") }
            if bytes[pos] == UInt8(ascii: "0") {
                pos += 1
            } else if isDigit(bytes[pos]) {
                while pos < bytes.count, isDigit(bytes[pos]) { pos += 1 }
            } else {
                // "-Infinity" and friends land here.
                throw fail("bad number")
            }
            let intEnd = pos
            var isInteger = true
            if pos + 1 < bytes.count, bytes[pos] == UInt8(ascii: "."), isDigit(bytes[pos + 1]) {
                isInteger = false
                pos += 1
                while pos < bytes.count, isDigit(bytes[pos]) { pos += 1 }
            }
            if pos < bytes.count, bytes[pos] == UInt8(ascii: "e") || bytes[pos] == UInt8(ascii: "E") {
                var look = pos + 1
                if look < bytes.count, bytes[look] == UInt8(ascii: "+") || bytes[look] == UInt8(ascii: "-") {
                    look += 1
                }
                if look < bytes.count, isDigit(bytes[look]) {
                    isInteger = false
                    pos = look
                    while pos < bytes.count, isDigit(bytes[pos]) { pos += 1 }
                }
            }
            let text = String(decoding: bytes[start..<pos], as: UTF8.self)
            if isInteger {
                // §2: an integer whose nearest double is infinite is malformed like 1e400
                // (more than 309 digits, or from 2^1024 - 2^970 up); no digit limit of our own.
                let digits = intEnd - start - (bytes[start] == UInt8(ascii: "-") ? 1 : 0)
                guard digits <= 309, let value = Double(text), value.isFinite else {
                    throw fail("integer \(text.prefix(24))… (\(digits) digits) is beyond a double")
                }
                return JSONNumber(isInteger: true, int: Int64(text), double: value)
            }
            guard let value = Double(text), value.isFinite else {
                throw fail("number \(text.prefix(24)) is not finite")
            }
            return JSONNumber(isInteger: false, int: nil, double: value)
        }
    }
}

/// Canonical JSON out: sorted keys, no whitespace, UTF-8 (what edgereg signs and reports).
public enum CanonicalJSON {
    public static func encode(_ value: JSONValue) -> Data {
        var out = ""
        write(value, into: &out)
        return Data(out.utf8)
    }

    public static func string(_ value: JSONValue) -> String {
        var out = ""
        write(value, into: &out)
        return out
    }

    static func write(_ value: JSONValue, into out: inout String) {
        switch value {
        case .null: out += "null"
        case .bool(let b): out += b ? "true" : "false"
        case .number(let n):
            if n.isInteger, let i = n.int {
                out += String(i)
            } else {
                out += formatDouble(n.double)
            }
        case .string(let s): writeString(s, into: &out)
        case .array(let items):
            out += "["
            for (i, item) in items.enumerated() {
                if i > 0 { out += "," }
                write(item, into: &out)
            }
            out += "]"
        case .object(let object):
            out += "{"
            // Code-point order, as the reference's sort of str keys.
            let keys = object.keys.sorted { Array($0.unicodeScalars.map(\.value)).lexicographicallyPrecedes($1.unicodeScalars.map(\.value)) }
            for (i, key) in keys.enumerated() {
                if i > 0 { out += "," }
                writeString(key, into: &out)
                out += ":"
                write(object[key]!, into: &out)
            }
            out += "}"
        }
    }

    /// The reference's float spelling (Python's repr): shortest round trip, `25.0`, `1e-05`.
    static func formatDouble(_ d: Double) -> String {
        if d == d.rounded(), abs(d) < 1e16 {
            return String(format: "%.1f", d)
        }
        return "\(d)"
    }

    static func writeString(_ s: String, into out: inout String) {
        out += "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case "\u{08}": out += "\\b"
            case "\u{0C}": out += "\\f"
            default:
                if scalar.value < 0x20 {
                    out += String(format: "\\u%04x", scalar.value)
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        out += "\""
    }
}
