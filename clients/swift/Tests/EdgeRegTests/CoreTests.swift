import Foundation
import Testing

@testable import EdgeReg

func hex(_ s: String) -> Data { Data(hex: s)! }

@Suite struct Ed25519Tests {
    /// RFC 8032 §7.1: (name, public key, message, signature).
    static let rfc8032: [(String, String, String, String)] = [
        ("TEST 1", "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", "",
         "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"),
        ("TEST 2", "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c", "72",
         "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00"),
        ("TEST 3", "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025", "af82",
         "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a"),
        ("TEST SHA(abc)", "ec172b93ad5e563bf4932c70e1245034c35467ef2efd4d64ebf819683467e2bf",
         "ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f",
         "dc2a4459e7369633a52b1bf277839a00201009a3efbf3ecb69bea2186c26b58909351fc9ac90b3ecfdfbc7c66431e0303dca179c138ac17ad9bef1177331a704"),
    ]

    static let seeds = [
        "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
        "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
        "c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
        "833fe62409237b9d62ec77587520911e9a759cec1d19755b7da901b96dca3d42",
    ]

    @Test(arguments: rfc8032.indices)
    func rfc8032Verifies(_ i: Int) {
        let (_, pub, msg, sig) = Self.rfc8032[i]
        #expect(Ed25519.verify(signature: hex(sig), message: hex(msg), publicKey: hex(pub)))
    }

    @Test(arguments: rfc8032.indices)
    func rfc8032SignsTheSame(_ i: Int) throws {
        let (_, pub, msg, sig) = Self.rfc8032[i]
        let signed = try #require(Ed25519.sign(hex(msg), seed: hex(Self.seeds[i])))
        #expect(signed.publicKey == hex(pub))
        #expect(signed.signature == hex(sig))
    }

    /// Flip each bit of the signature, then of the message: nothing else verifies.
    @Test(arguments: rfc8032.indices)
    func anyFlippedBitFails(_ i: Int) {
        let (_, pub, msg, sig) = Self.rfc8032[i]
        let s = hex(sig), m = hex(msg), p = hex(pub)
        for bit in stride(from: 0, to: s.count * 8, by: 7) {
            var t = s
            t[bit / 8] ^= UInt8(1 << (bit % 8))
            #expect(!Ed25519.verify(signature: t, message: m, publicKey: p))
        }
        for bit in stride(from: 0, to: m.count * 8, by: 3) {
            var t = m
            t[bit / 8] ^= UInt8(1 << (bit % 8))
            #expect(!Ed25519.verify(signature: s, message: t, publicKey: p))
        }
        #expect(!Ed25519.verify(signature: s, message: m + Data([0]), publicKey: p))
        #expect(!Ed25519.verify(signature: s.prefix(63), message: m, publicKey: p))
    }

    @Test func pemKeysAndKeyIDs() throws {
        let pem = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAfnwXF6sEv2j9t88ofZUn84+Zz4m14EUGoihzf7dIos8=\n-----END PUBLIC KEY-----\n"
        let key = try #require(PublicKey(pem: pem))
        #expect(key.raw.count == 32)
        #expect(key.keyID == SHA256Hasher.hex(key.raw))
        #expect(PublicKey(raw: key.raw)?.keyID == key.keyID)
        #expect(PublicKey(pem: "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----") == nil)
        #expect(PublicKey(pem: "not a key") == nil)
        let privatePEM = try String(contentsOf: vectorsDir.appendingPathComponent("keys/test-only-registry.private.pem"), encoding: .utf8)
        let seed = try #require(Ed25519.seed(pkcs8PEM: privatePEM))
        let signed = try #require(Ed25519.sign(Data("x".utf8), seed: seed))
        #expect(signed.publicKey == key.raw, "the committed test key pair belongs together")
    }
}

@Suite struct SHA256Tests {
    @Test func knownDigests() {
        #expect(SHA256Hasher.hex(Data()) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        #expect(SHA256Hasher.hex(Data("abc".utf8)) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(SHA256Hasher.hex(Data("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq".utf8))
                == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")
    }

    @Test func incrementalEqualsOneShot() {
        var h = SHA256Hasher()
        let chunk = Data(repeating: UInt8(ascii: "a"), count: 1000)
        for _ in 0..<1000 { h.update(chunk) }
        #expect(h.finalize().hexString == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0")
    }
}

@Suite struct StrictJSONTests {
    static let cases: [(String, Bool)] = [
        ("{\"a\":1}", true), ("[]", true), ("\"x\"", true), ("1", true), ("-0", true), ("9.0", true), ("1e5", true),
        (" {\"a\" : [1, 2.5, true, false, null]} \n", true), ("{\"a\":\"\\u00e9\\ud83d\\ude00\"}", true),
        ("[\"\\ud83d\\ude00\", \"\\uD83D\\uDE00\", \"\\\\ud800\"]", true),  // pairs; an escaped backslash
        // Lone surrogate escapes (docs/protocol.md §2): high alone, low alone, high then not low.
        ("[\"\\ud800\"]", false), ("[\"\\udc00\"]", false), ("[\"\\ud800\\u0041\"]", false),
        ("[\"\\udc00\\ud800\"]", false), ("{\"\\ud800\":1}", false), ("[\"\\ud800\", \"\\udc00\"]", false),
        ("[\"\\ud83d\u{1F600}\"]", false),  // a high escape, then a literal pair
        ("{\"a\":1,\"a\":2}", false), ("{\"a\":1,\"\\u0061\":2}", false), ("{\"a\":{\"b\":1,\"b\":1}}", false),
        ("NaN", false), ("Infinity", false), ("-Infinity", false), ("[1e400]", false), ("[-1e400]", false),
        ("01", false), ("1.", false), (".5", false), ("+1", false), ("1e", false), ("[1,]", false), ("{\"a\":1,}", false),
        ("'a'", false), ("\"\t\"", false), ("\"\\x\"", false), ("\"\\u12\"", false), ("[1] x", false), ("", false),
        ("\u{FEFF}{}", false), ("tru", false), ("nul", false), ("{1:2}", false),
    ]

    @Test(arguments: cases.indices)
    func table(_ i: Int) {
        let (text, valid) = Self.cases[i]
        #expect(StrictJSON.isValid(Data(text.utf8)) == valid, "\(text)")
    }

    @Test func depthIsLimitedBeforeRecursion() {
        let ok = String(repeating: "[", count: 64) + String(repeating: "]", count: 64)
        let deep = String(repeating: "[", count: 65) + String(repeating: "]", count: 65)
        #expect(StrictJSON.isValid(Data(ok.utf8)))
        #expect(!StrictJSON.isValid(Data(deep.utf8)))
        // 60,000 brackets cannot exhaust the stack.
        #expect(!StrictJSON.isValid(Data(String(repeating: "[", count: 60_000).utf8)))
        #expect(!StrictJSON.isValid(Data(String(repeating: "{\"a\":", count: 100).utf8)))
    }

    @Test func notUTF8() {
        #expect(!StrictJSON.isValid(Data([0x22, 0xFF, 0x22])))
        #expect(!StrictJSON.isValid(Data([0x22, 0xED, 0xA0, 0x80, 0x22])))  // an encoded surrogate
        #expect(!StrictJSON.isValid(Data([0x22, 0xC0, 0xA2, 0x22])))  // overlong '"'
        #expect(!StrictJSON.isValid(Data([0x22, 0xF4, 0x90, 0x80, 0x80, 0x22])))  // above U+10FFFF
        #expect(!StrictJSON.isValid(Data([0x22, 0xE2, 0x82])))  // cut short
        #expect(StrictJSON.isValid(Data("\"é€😀\"".utf8)))
        // The validator agrees with the standard library on every 1- to 3-byte sequence start.
        for a in UInt8(0x80)...UInt8(0xFF) {
            for b in [UInt8(0x80), 0x9F, 0xA0, 0xBF, 0xC0] {
                let bytes = [a, b, 0x80, 0x80]
                for n in 2...4 {
                    let slice = Array(bytes.prefix(n))
                    #expect(StrictJSON.isUTF8(slice) == (String(validating: slice, as: UTF8.self) != nil), "\(slice)")
                }
            }
        }
    }

    @Test func integersStayExact() throws {
        let v = try StrictJSON.parse(Data("[9007199254740991, 9.0, 99999999999999999999]".utf8))
        let items = try #require(v.arrayValue)
        #expect(items[0].intValue == 9_007_199_254_740_991)
        #expect(items[1].intValue == nil)
        #expect(items[1].doubleValue == 9.0)
        #expect(items[2].intValue == nil)  // an integer, but beyond 64 bits
        #expect(!StrictJSON.isValid(Data(String(repeating: "1", count: 4301).utf8)))
    }

    @Test func canonicalOutput() throws {
        let v = try StrictJSON.parse(Data("{\"b\":[1,2.5,25.0],\"a\":\"é\\n\",\"c\":null}".utf8))
        #expect(CanonicalJSON.string(v) == "{\"a\":\"é\\n\",\"b\":[1,2.5,25.0],\"c\":null}")
    }
}

@Suite struct RuleTests {
    @Test func percentInBasisPoints() {
        for point in stride(from: 0, through: 10000, by: 1) {
            #expect(Percent.basisPoints(Double(point) / 100) == point)
        }
        #expect(Percent.basisPoints(0.001) == nil)
        #expect(Percent.basisPoints(100.01) == nil)
        #expect(Percent.basisPoints(.nan) == nil)
    }

    @Test func cohortGolden() {
        // tests/test_rollout.py GOLDEN: 1.1 % is 110 basis points, not 110.00000000000001.
        let salt = "5f3a9c0e1b2d4c6a"
        #expect(Cohort.bucket(deviceID: "a", salt: salt) == 6830)
        #expect(!Cohort.contains(deviceID: "a", salt: salt, percent: 68.3))
        #expect(Cohort.contains(deviceID: "a", salt: salt, percent: 68.31))
        #expect(Cohort.bucket(deviceID: "ünïcode-device", salt: salt) == 289)
    }

    @Test func socPatterns() {
        #expect(Tiers.socMatches("Snapdragon 8*", "snapdragon 8 gen 3"))
        #expect(Tiers.socMatches("Apple A1?", "Apple A15"))
        #expect(!Tiers.socMatches("Apple A1?", "Apple A1"))
        #expect(!Tiers.socMatches("[Snapdragon 8]", "Snapdragon 8"))
        #expect(Tiers.socMatches("[Snapdragon 8]", "[snapdragon 8]"))
        #expect(Tiers.socMatches("*", ""))
        #expect(Tiers.socMatches("a*b*c", "aXXbYYc"))
        #expect(!Tiers.socMatches("a*b*c", "aXXbYY"))
    }

    @Test func times() {
        #expect(WireTime.parse("2025-06-01T12:00:00Z") == 1_748_779_200)
        #expect(WireTime.format(1_748_779_200) == "2025-06-01T12:00:00Z")
        #expect(WireTime.parse("2025-02-29T00:00:00Z") == nil)
        #expect(WireTime.parse("2024-02-29T00:00:00Z") != nil)
        #expect(WireTime.parse("2025-06-01T12:00:00.5Z") == nil)
        #expect(WireTime.parse("2025-06-01T12:00:00+00:00") == nil)
        #expect(WireTime.parse("2025-06-01t12:00:00z") == nil)
    }
}

@Suite struct GoldenReleaseVectors {
    /// The frozen 0.1.0 vectors (docs/protocol.md §3): decided exactly as recorded, except
    /// `unknown-field`, the one rule relaxed by design (0.1.0 refused unknown payload keys).
    @Test func frozen010() throws {
        let dir = vectorsDir.deletingLastPathComponent().appendingPathComponent("golden/manifests-0.1.0")
        let files = try FileManager.default.contentsOfDirectory(atPath: dir.path).filter { $0.hasSuffix(".json") }.sorted()
        #expect(files.count >= 30)
        for file in files {
            let vector = try StrictJSON.parse(Data(contentsOf: dir.appendingPathComponent(file)))
            var got = try Conformance.decide(try #require(vector["input"]))
            let expected = try #require(vector["expected"])
            // 0.1.0 recorded no `fallback` (added later; `runtime_fallback` says the same).
            if expected["fallback"] == nil, var o = got.objectValue {
                o["fallback"] = nil
                got = .object(o)
            }
            // Nor `substitute` (added with fit rule (e)): an 0.1.0 manifest never has an instead.
            if expected["accept"]?.boolValue == true, expected["substitute"] == nil, var o = got.objectValue {
                #expect(o["substitute"]?.isNull == true, "\(file): substitute")
                o["substitute"] = nil
                got = .object(o)
            }
            if file == "unknown-field.json" {
                #expect(expected["reason"]?.stringValue == "malformed")
                #expect(got["accept"]?.boolValue == true)
                continue
            }
            #expect(CanonicalJSON.string(got) == CanonicalJSON.string(expected), "\(file)")
        }
    }
}
