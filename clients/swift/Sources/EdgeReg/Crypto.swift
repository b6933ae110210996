import Foundation

#if canImport(CryptoKit)
import CryptoKit
#else
import CCrypto
import CSodium
#endif

// The only platform split of the package: CryptoKit on Apple platforms; elsewhere
// libsodium (CSodium) for Ed25519 and OpenSSL's libcrypto (CCrypto) for SHA-256,
// whose assembly uses the CPU's SHA instructions (libsodium's SHA-256 is portable C,
// about six times slower: most of a cold update's CPU time). Both sit behind
// `SHA256Hasher` and `Ed25519`, tested with the same vectors.

/// Incremental SHA-256 (a blob is hashed while it downloads).
public struct SHA256Hasher: @unchecked Sendable {  // a value: its state is copied, never shared
    #if canImport(CryptoKit)
    private var hasher = CryptoKit.SHA256()
    #else
    private var state = SHA256_CTX()
    #endif

    public init() {
        #if !canImport(CryptoKit)
        SHA256_Init(&state)
        #endif
    }

    public mutating func update(_ data: Data) {
        #if canImport(CryptoKit)
        hasher.update(data: data)
        #else
        data.withUnsafeBytes { raw in
            _ = SHA256_Update(&state, raw.baseAddress, raw.count)
        }
        #endif
    }

    public mutating func update(_ bytes: [UInt8]) {
        update(Data(bytes))
    }

    /// The digest; the hasher is spent afterwards.
    public mutating func finalize() -> Data {
        #if canImport(CryptoKit)
        return Data(hasher.finalize())
        #else
        var out = [UInt8](repeating: 0, count: 32)
        SHA256_Final(&out, &state)
        return Data(out)
        #endif
    }

    public static func digest(_ data: Data) -> Data {
        var h = SHA256Hasher()
        h.update(data)
        return h.finalize()
    }

    public static func hex(_ data: Data) -> String {
        digest(data).hexString
    }
}

/// Ed25519 signature verification (RFC 8032).
public enum Ed25519 {
    /// True when `signature` (64 bytes) is `publicKey`'s (32 bytes) signature of `message`.
    public static func verify(signature: Data, message: Data, publicKey: Data) -> Bool {
        guard signature.count == 64, publicKey.count == 32 else { return false }
        #if canImport(CryptoKit)
        guard let key = try? Curve25519.Signing.PublicKey(rawRepresentation: publicKey) else { return false }
        return key.isValidSignature(signature, for: message)
        #else
        Sodium.ready()
        let sig = [UInt8](signature), pk = [UInt8](publicKey), msg = [UInt8](message)
        return crypto_sign_verify_detached(sig, msg, UInt64(msg.count), pk) == 0
        #endif
    }
}

extension Ed25519 {
    /// The public key and signature for a 32-byte seed (RFC 8032 private key): for tests
    /// and tools that sign; a client only verifies.
    static func sign(_ message: Data, seed: Data) -> (publicKey: Data, signature: Data)? {
        guard seed.count == 32 else { return nil }
        #if canImport(CryptoKit)
        guard let key = try? Curve25519.Signing.PrivateKey(rawRepresentation: seed),
            let sig = try? key.signature(for: message)
        else { return nil }
        return (key.publicKey.rawRepresentation, sig)
        #else
        Sodium.ready()
        var pk = [UInt8](repeating: 0, count: 32), sk = [UInt8](repeating: 0, count: 64)
        guard crypto_sign_seed_keypair(&pk, &sk, [UInt8](seed)) == 0 else { return nil }
        var sig = [UInt8](repeating: 0, count: 64)
        let msg = [UInt8](message)
        guard crypto_sign_detached(&sig, nil, msg, UInt64(msg.count), sk) == 0 else { return nil }
        return (Data(pk), Data(sig))
        #endif
    }

    /// The seed of an unencrypted PKCS#8 PEM Ed25519 private key.
    static func seed(pkcs8PEM text: String) -> Data? {
        let begin = "-----BEGIN PRIVATE KEY-----", end = "-----END PRIVATE KEY-----"
        guard let a = text.range(of: begin), let b = text.range(of: end, range: a.upperBound..<text.endIndex),
            let der = Data(base64Encoded: String(text[a.upperBound..<b.lowerBound].filter { !$0.isWhitespace }))
        else { return nil }
        let prefix: [UInt8] = [0x30, 0x2E, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2B, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20]
        guard der.count == 48, Array(der.prefix(16)) == prefix else { return nil }
        return der.suffix(32)
    }
}

#if !canImport(CryptoKit)
enum Sodium {
    private static let initialised: Bool = { sodium_init() >= 0 }()
    static func ready() { _ = initialised }
}
#endif

extension Data {
    /// Lowercase hex.
    public var hexString: String {
        let digits = Array("0123456789abcdef".utf8)
        var out = [UInt8]()
        out.reserveCapacity(count * 2)
        for byte in self {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0x0F)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Bytes of a hex string (either case), or nil.
    public init?(hex: String) {
        let chars = Array(hex.utf8)
        guard chars.count % 2 == 0 else { return nil }
        var out = [UInt8]()
        out.reserveCapacity(chars.count / 2)
        func value(_ c: UInt8) -> UInt8? {
            switch c {
            case 48...57: return c - 48
            case 97...102: return c - 87
            case 65...70: return c - 55
            default: return nil
            }
        }
        var i = 0
        while i < chars.count {
            guard let hi = value(chars[i]), let lo = value(chars[i + 1]) else { return nil }
            out.append(hi << 4 | lo)
            i += 2
        }
        self.init(out)
    }
}

enum Base64 {
    /// Standard padded base64 (RFC 4648 §4), only its one canonical spelling.
    static func decodeCanonical(_ text: String) -> Data? {
        guard let data = Data(base64Encoded: text), data.base64EncodedString() == text else { return nil }
        return data
    }
}

/// A pinned Ed25519 public key and its key id.
public struct PublicKey: Sendable, Hashable {
    /// The raw 32 bytes (RFC 8032 encoding).
    public let raw: Data
    /// Lowercase hex SHA-256 of `raw` (docs/protocol.md §2).
    public let keyID: String

    public init?(raw: Data) {
        guard raw.count == 32 else { return nil }
        self.raw = raw
        keyID = SHA256Hasher.hex(raw)
    }

    /// A key from PEM (SubjectPublicKeyInfo), or the raw 32 bytes (docs/protocol.md §4).
    public init?(pem data: Data) {
        if data.count == 32 {
            self.init(raw: data)
            return
        }
        guard let text = String(data: data, encoding: .utf8) else { return nil }
        self.init(pem: text)
    }

    public init?(pem text: String) {
        let begin = "-----BEGIN PUBLIC KEY-----", end = "-----END PUBLIC KEY-----"
        guard let start = text.range(of: begin), let stop = text.range(of: end, range: start.upperBound..<text.endIndex)
        else { return nil }
        let body = text[start.upperBound..<stop.lowerBound].filter { !$0.isWhitespace }
        guard let der = Data(base64Encoded: String(body)) else { return nil }
        // SubjectPublicKeyInfo of an Ed25519 key: the fixed 12-byte prefix (OID 1.3.101.112).
        let prefix: [UInt8] = [0x30, 0x2A, 0x30, 0x05, 0x06, 0x03, 0x2B, 0x65, 0x70, 0x03, 0x21, 0x00]
        guard der.count == 44, Array(der.prefix(12)) == prefix else { return nil }
        self.init(raw: der.suffix(32))
    }
}

/// The keys an app pins, by key id (the same key twice counts once).
public struct TrustedKeys: Sendable {
    public let byID: [String: PublicKey]

    public init(_ keys: [PublicKey]) {
        var byID: [String: PublicKey] = [:]
        for key in keys { byID[key.keyID] = key }
        self.byID = byID
    }

    /// Keys from PEM texts; nil when any is not an Ed25519 public key.
    public init?(pems: [String]) {
        var keys: [PublicKey] = []
        for pem in pems {
            guard let key = PublicKey(pem: pem) else { return nil }
            keys.append(key)
        }
        self.init(keys)
    }
}
