import Foundation

/// The conformance vectors' shapes (docs/protocol.md §9): a vector's `input` in,
/// its `expected` out. The test suite and the device program's `decide` and
/// `check_blob` both go through here.
public enum Conformance {
    public struct HarnessError: Error, Sendable, CustomStringConvertible {
        public let description: String
        init(_ description: String) { self.description = description }
    }

    /// The decision for a `tests/vectors/*.json` input, shaped like its `expected`.
    public static func decide(_ input: JSONValue) throws(HarnessError) -> JSONValue {
        guard let o = input.objectValue else { throw HarnessError("vector input is not an object") }
        guard let manifestText = o["manifest"]?.stringValue, let manifest = Data(base64Encoded: manifestText) else {
            throw HarnessError("vector input has no base64 'manifest'")
        }
        guard let pems = o["trusted_keys"]?.arrayValue?.compactMap(\.stringValue), let trusted = TrustedKeys(pems: pems) else {
            throw HarnessError("vector input 'trusted_keys' are not Ed25519 PEM public keys")
        }
        guard let model = o["model"]?.stringValue, let tier = o["tier"]?.stringValue else {
            throw HarnessError("vector input needs 'model' and 'tier'")
        }
        guard let device = o["device"]?.objectValue, let deviceID = device["device_id"]?.stringValue else {
            throw HarnessError("vector input needs 'device.device_id'")
        }
        guard let nowText = o["now"]?.stringValue, let now = WireTime.parseLenient(nowText) else {
            throw HarnessError("vector input needs an RFC 3339 'now'")
        }
        let seen = o["highest_seen_sequence"]?.intValue
        let app = AppFacts(
            mnnRuntime: device["mnn_runtime"]?.stringValue, appVersion: device["app_version"]?.stringValue,
            os: device["os"]?.stringValue, osVersion: device["os_version"]?.stringValue)
        let bundle = o["bundle"]?.boolValue ?? false
        let decisionInput = Decide.Input(
            manifest: manifest, trusted: trusted, unit: model, tier: tier, deviceID: deviceID, app: app,
            highestSeenSequence: seen, now: now, bundle: bundle)
        do {
            let decision = try Decide.decide(decisionInput)
            let entry: JSONValue
            switch decision.entry {
            case nil: entry = .null
            case .model(let m)?: entry = entryJSON(m)
            case .bundle(let b)?:
                entry = .object(JSONObject([
                    ("version", .string(b.version)),
                    ("members", .object(JSONObject(b.memberNames.map { ($0, entryJSON(b.members[$0]!)) }))),
                ]))
            }
            return .object(JSONObject([
                ("accept", .bool(true)), ("entry", entry), ("is_candidate", .bool(decision.isCandidate)),
                ("runtime_fallback", .bool(decision.runtimeFallback)),
                ("fallback", decision.fallback.map { .string($0) } ?? .null), ("sequence", .int(decision.sequence)),
            ]))
        } catch {
            return .object(JSONObject([("accept", .bool(false)), ("reason", .string(error.reason))]))
        }
    }

    static func entryJSON(_ m: ModelEntry) -> JSONValue {
        .object(JSONObject([
            ("version", .string(m.version)), ("variant", .string(m.variant)), ("sha256", .string(m.sha256)),
            ("size", .int(m.size)),
        ]))
    }

    /// Rules 13–14 for a `tests/vectors/blobs/*.json` input.
    public static func checkBlob(_ input: JSONValue) throws(HarnessError) -> JSONValue {
        guard let o = input.objectValue, let entry = o["entry"]?.objectValue, let sha = entry["sha256"]?.stringValue,
            let size = entry["size"]?.intValue, let bodyText = o["body"]?.stringValue, let body = Data(base64Encoded: bodyText)
        else { throw HarnessError("blob vector input needs entry.sha256, entry.size and a base64 body") }
        var check = BlobCheck(sha256: sha, size: size)
        do {
            try check.expect(o["content_length"]?.intValue)
            try check.update(body)
            try check.finish()
            return .object(JSONObject([("accept", .bool(true))]))
        } catch {
            return .object(JSONObject([("accept", .bool(false)), ("reason", .string(error.reason))]))
        }
    }

    /// Tiers in order from `[{"name", "rules"}]` (tests/vectors/rules/tiers.json) or an
    /// object whose key order is the tier order (the device program's `tiers`).
    public static func tiers(_ value: JSONValue) -> [(String, TierRules)]? {
        var out: [(String, TierRules)] = []
        if let list = value.arrayValue {
            for item in list {
                guard let name = item["name"]?.stringValue, let rules = item["rules"].flatMap(TierRules.init(json:)) else { return nil }
                out.append((name, rules))
            }
        } else if let o = value.objectValue {
            for key in o.keys {
                guard let rules = TierRules(json: o[key]!) else { return nil }
                out.append((key, rules))
            }
        } else {
            return nil
        }
        return out
    }
}
