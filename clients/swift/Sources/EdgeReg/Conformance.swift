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
        let decisionInput = try decideInput(input)
        do {
            let decision = try Decide.decide(decisionInput)
            let entry: JSONValue
            switch decision.entry {
            case nil: entry = .null
            case .model(let m)?:
                // The chosen entry's metrics as the wire says them (an instead says none).
                guard m.declaresMetrics, let metrics = m.metrics, case .object(var o) = entryJSON(m) else {
                    entry = entryJSON(m)
                    break
                }
                o["metrics"] = AppMetric.json(metrics)
                entry = .object(o)
            case .bundle(let b)?:
                var o = JSONObject([
                    ("version", .string(b.version)),
                    ("members", .object(JSONObject(b.memberNames.map { ($0, entryJSON(b.members[$0]!)) }))),
                ])
                if let metrics = b.metrics { o["metrics"] = AppMetric.json(metrics) }
                entry = .object(o)
            }
            return .object(JSONObject([
                ("accept", .bool(true)), ("entry", entry), ("is_candidate", .bool(decision.isCandidate)),
                ("runtime_fallback", .bool(decision.runtimeFallback)),
                ("fallback", decision.fallback.map { .string($0) } ?? .null),
                ("substitute", decision.substitute.map { .string($0) } ?? .null), ("sequence", .int(decision.sequence)),
            ]))
        } catch {
            return .object(JSONObject([("accept", .bool(false)), ("reason", .string(error.reason))]))
        }
    }

    /// A decision vector's input as the decision takes it.
    static func decideInput(_ input: JSONValue) throws(HarnessError) -> Decide.Input {
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
            os: device["os"]?.stringValue, osVersion: device["os_version"]?.stringValue,
            cpuFeatures: try cpuFeatures(device["cpu_features"]), memoryBudgetMB: device["memory_budget_mb"]?.doubleValue,
            mnnAPIs: try cpuFeatures(device["mnn_apis"]))
        let bundle = o["bundle"]?.boolValue ?? false
        return Decide.Input(
            manifest: manifest, trusted: trusted, unit: model, tier: tier, deviceID: deviceID, app: app,
            highestSeenSequence: seen, now: now, bundle: bundle)
    }

    /// tests/vectors/hints: the decision, then the chosen entry's try-set and the runtime the
    /// device uses (§11, "Runtime hints"); the device holds the hint facts (`cpu_class`,
    /// `cores`, `soc`; left out: not known).
    public static func checkHints(_ input: JSONValue) throws(HarnessError) -> JSONValue {
        let decisionInput = try decideInput(input)
        let decision: Decision
        do {
            decision = try Decide.decide(decisionInput)
        } catch {
            return .object(JSONObject([("accept", .bool(false)), ("reason", .string(error.reason))]))
        }
        guard case .model(let entry)? = decision.entry else {
            var pairs: [(String, JSONValue)] = [("accept", .bool(true))]
            for key in ["entry", "runtime_trials", "runtime", "rule", "matched"] { pairs.append((key, .null)) }
            return .object(JSONObject(pairs))
        }
        let device = input["device"]?.objectValue
        var facts = HintFacts()
        facts.cpuClass = device?["cpu_class"]?.stringValue
        if let cores = device?["cores"]?.intValue { facts.cores = Int(cores) }
        facts.soc = device?["soc"]?.stringValue
        let choice = RuntimeChoice(entry: entry, facts: facts, deviceID: decisionInput.deviceID)
        let trials: JSONValue = entry.runtimeTrials?.json ?? .null
        let rule: JSONValue = choice.rule.map { JSONValue.int($0) } ?? .null
        let matched: JSONValue = choice.matched.map { JSONValue.int($0) } ?? .null
        let pairs: [(String, JSONValue)] = [
            ("accept", .bool(true)), ("entry", entryJSON(entry)), ("runtime_trials", trials), ("runtime", choice.runtime.json),
            ("rule", rule), ("matched", matched),
        ]
        return .object(JSONObject(pairs))
    }

    /// A vector's (or the device program's) `cpu_features`: a list of names; absent or null is not said.
    public static func cpuFeatures(_ value: JSONValue?) throws(HarnessError) -> Set<String>? {
        guard let value, !value.isNull else { return nil }
        guard let list = value.arrayValue, let names = Optional(list.compactMap(\.stringValue)), names.count == list.count else {
            throw HarnessError("cpu_features is not a list of strings")
        }
        return Set(names)
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
        do throws(Rejection) {
            let length = o["content_length"]?.intValue
            try check.expect(length)
            try check.update(body)
            if let length, Int64(body.count) < length {
                // Fewer bytes than announced (and held to what remains): a cut connection.
                throw Rejection(Reason.transport, "connection closed after \(body.count) of \(length) announced bytes")
            }
            try check.finish()
            return .object(JSONObject([("accept", .bool(true))]))
        } catch {
            return .object(JSONObject([("accept", .bool(false)), ("reason", .string(error.reason))]))
        }
    }

    /// Tiers in order from `[{"name", "rules"}]`: tests/vectors/rules/tiers.json and the device
    /// program's `tiers` (the array of a tier file, docs/protocol.md §5).
    public static func tiers(_ value: JSONValue) -> [(String, TierRules)]? {
        guard let list = value.arrayValue else { return nil }
        var out: [(String, TierRules)] = []
        for item in list {
            guard let name = item["name"]?.stringValue, let rules = item["rules"].flatMap(TierRules.init(json:)) else { return nil }
            out.append((name, rules))
        }
        return out
    }

    /// A `tests/vectors/tiers/*.json` input: read the tier file, then resolve the device's tier.
    public static func checkTierFile(_ input: JSONValue) throws(HarnessError) -> JSONValue {
        guard let text = input["file"]?.stringValue, let data = Data(base64Encoded: text), let d = input["device"]?.objectValue else {
            throw HarnessError("tier-file vector input needs base64 'file' and 'device'")
        }
        guard let tiers = Tiers.parse(data) else { return .object(JSONObject([("accept", .bool(false))])) }
        let device = DeviceFacts(deviceID: "d", ramMB: d["ram_mb"]?.intValue, cpuCores: d["cpu_cores"]?.intValue,
                                 soc: d["soc"]?.stringValue, os: d["os"]?.stringValue)
        let tier = Tiers.resolve(tiers, device)?.tier
        return .object(JSONObject([
            ("accept", .bool(true)), ("order", .array(tiers.map { .string($0.0) })), ("tier", tier.map { .string($0) } ?? .null),
        ]))
    }

    /// A `tests/vectors/conditions/*.json` input: why the policy defers a download, if it does (§8).
    public static func checkConditions(_ input: JSONValue) throws(HarnessError) -> JSONValue {
        guard let p = input["policy"]?.objectValue, let c = input["conditions"]?.objectValue else {
            throw HarnessError("conditions vector input needs 'policy' and 'conditions'")
        }
        func flag(_ key: String) throws(HarnessError) -> Bool {
            guard let b = p[key]?.boolValue else { throw HarnessError("policy.\(key) is a boolean") }
            return b
        }
        let policy = DownloadPolicy(allowMetered: try flag("allow_metered"), requireCharging: try flag("require_charging"),
                                    requireIdle: try flag("require_idle"), requireStorageNotLow: try flag("require_storage_not_low"))
        let said = Conditions(metered: c["metered"]?.boolValue, charging: c["charging"]?.boolValue, idle: c["idle"]?.boolValue,
                              storageLow: c["storage_low"]?.boolValue)
        return .object(JSONObject([("deferred", policy.unmet(said).map { .string($0) } ?? .null)]))
    }

    /// A `tests/vectors/selftest/*.json` input: each backend's outcome if tried, and the verdict
    /// of rules 15–20 (docs/protocol.md §11).
    public static func checkSelfTest(_ input: JSONValue) throws(HarnessError) -> JSONValue {
        guard let backends = input["backends"]?.arrayValue?.compactMap(\.stringValue), let remembered = input["remembered"]?.objectValue,
            let outcomes = input["trials"]?.objectValue, let probe = input["probe"]?.boolValue
        else { throw HarnessError("self-test vector input needs backends, probe, remembered and trials") }
        var trials: [(backend: String, kind: String)] = []
        for backend in backends {
            if remembered[backend] != nil {
                trials.append((backend, "remembered"))
                continue
            }
            guard var kind = outcomes[backend]?.stringValue else { throw HarnessError("no trial outcome for \(backend)") }
            if kind == "passed", !probe { kind = "loaded" }
            trials.append((backend, kind))
            if kind == "passed" || kind == "loaded" { break }
        }
        let (verdict, backend) = SelfTestVerdict.judge(trials)
        let skipped = trials.filter { ["failed", "load-failed", "remembered"].contains($0.kind) }.map { JSONValue.string($0.backend) }
        let tried = trials.filter { $0.kind != "remembered" }.map { JSONValue.string($0.backend) }
        let ran = trials.filter { $0.kind == "failed" || $0.kind == "load-failed" }
        var report: JSONValue = .null
        if verdict != "not-run" {
            let install = verdict == "install"
            report = .object(JSONObject([
                ("probe", .string(install ? (probe ? "passed" : "none") : "failed")),
                ("backend", backend.map { .string($0) } ?? .null),
                ("backends_skipped", .array(skipped)),
                ("load_failed", .bool(!install && !ran.isEmpty && ran.allSatisfy { $0.kind == "load-failed" })),
            ]))
        }
        return .object(JSONObject([
            ("verdict", .string(verdict)), ("backend", backend.map { .string($0) } ?? .null), ("tried", .array(tried)),
            ("mark_bad", .bool(verdict == "reject")), ("report", report),
        ]))
    }

    /// A `tests/vectors/health/*.json` input: the confirmation ledger over its steps (launch, a
    /// new process; install; app_started, a revert it decides carried out at once; confirm), and
    /// after each the ledger, the revert decided and the count reported (docs/protocol.md §11).
    public static func checkHealth(_ input: JSONValue) throws(HarnessError) -> JSONValue {
        guard let maxStarts = input["max_unconfirmed_starts"]?.intValue, let steps = input["steps"]?.arrayValue
        else { throw HarnessError("health vector input needs max_unconfirmed_starts and steps") }
        var h = UnitHealth(), started = false, out: [JSONValue] = []
        for step in steps {
            var revert: JSONValue = .null, reported: JSONValue = .null
            switch step["do"]?.stringValue {
            case "launch": started = false
            case "install":
                guard let version = step["version"]?.stringValue else { throw HarnessError("install needs a version") }
                h.onInstall(version, duringStart: started)
            case "confirm": _ = h.onConfirm(step["version"]?.stringValue)
            case "app_started":
                started = true
                let before = h.starts
                let decided = h.onStart(unit: "unit", maxStarts: Int(maxStarts))
                if h.installed != nil, !h.confirmed, h.starts > before { reported = .int(Int64(h.starts)) }
                if let decided {
                    revert = .object(JSONObject([("version", .string(decided.version)), ("to_version", decided.toVersion.map { .string($0) } ?? .null)]))
                    h.onReverted(to: decided.toVersion)
                }
            default: throw HarnessError("not a health step: \(step["do"] ?? .null)")
            }
            out.append(.object(JSONObject([
                ("installed", h.installed.map { .string($0) } ?? .null), ("confirmed", .bool(h.confirmed)),
                ("unconfirmed_starts", .int(Int64(h.starts))), ("revert", revert), ("reported", reported),
            ])))
        }
        return .object(JSONObject([("steps", .array(out))]))
    }

    /// A `tests/vectors/metrics/*.json` input: app metric calls counted into an install's totals
    /// (docs/protocol.md §11), from the totals before (saved as an earlier session of the app left
    /// them); per call `counted` or why it is refused, then the `metrics` the next report carries.
    public static func checkMetrics(_ input: JSONValue) throws(HarnessError) -> JSONValue {
        guard let before = input["counts"]?.objectValue, let calls = input["calls"]?.arrayValue,
            let parsed = try? AppMetric.declarations(input["declared"], "declared")
        else { throw HarnessError("metrics vector input needs declared, counts and calls") }
        let declared = parsed
        var tally = MetricCounts.Tally()
        for name in before.keys {
            let c = before[name]!
            if let counts = c["counts"]?.arrayValue {
                tally.totals[name] = .distribution(counts: counts.map { $0.intValue ?? 0 })
            } else {
                tally.totals[name] = .rate(events: c["events"]?.intValue ?? 0, successes: c["successes"]?.intValue ?? 0)
            }
        }
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("edgereg-metrics-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        let file = dir.appendingPathComponent("metrics.json")
        do {
            try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
            try JSONEncoder().encode(MetricCounts.Saved(installs: ["t": tally], order: ["t"])).write(to: file)
        } catch { throw HarnessError("cannot write \(file.path): \(error)") }
        let counts = MetricCounts(file: file)
        var outcomes: [JSONValue] = []
        for call in calls {
            let rate = call["record"] != nil
            guard let name = (rate ? call["record"] : call["observe"])?.stringValue else { throw HarnessError("a call names its metric") }
            var value = 0.0
            if !rate {
                switch call["value"] {
                case .string("NaN")?: value = .nan
                case .string("Infinity")?: value = .infinity
                case .string("-Infinity")?: value = -.infinity
                default:
                    guard let v = call["value"]?.doubleValue else { throw HarnessError("observe needs a value") }
                    value = v
                }
            }
            if let why = AppMetric.refusal(declared, name, kind: rate ? .rate : .distribution, value: value) {
                outcomes.append(.string(why.rawValue))
                continue
            }
            let metric = declared[name]!
            counts.count(token: "t", metric: metric, value: rate ? (call["success"]?.boolValue == true ? 1 : 0) : metric.bucket(for: value))
            outcomes.append(.string("counted"))
        }
        counts.awaitSaved()
        let totals = counts.totals("t")
        let metrics: JSONValue = totals.map { t in .object(JSONObject(t.keys.sorted().map { ($0, t[$0]!.json) })) } ?? .null
        return .object(JSONObject([("calls", .array(outcomes)), ("metrics", metrics)]))
    }

    /// One case of tests/vectors/rules/cohorts.json: the bucket and the cohort at each percent.
    public static func cohort(salt: String, deviceID: String, percents: [String]) -> JSONValue {
        var inside = JSONObject()
        for p in percents { inside[p] = .bool(Double(p).map { Cohort.contains(deviceID: deviceID, salt: salt, percent: $0) } ?? false) }
        return .object(JSONObject([("bucket", .int(Int64(Cohort.bucket(deviceID: deviceID, salt: salt)))), ("in_cohort", .object(inside))]))
    }
}

extension Conformance {
    /// A `tests/vectors/probes/*.json` input: the probe check on what a backend computed.
    public static func checkProbe(_ input: JSONValue) throws(HarnessError) -> JSONValue {
        guard let probeText = input["probe"]?.stringValue, let data = Data(base64Encoded: probeText),
            let artifact = input["artifact_sha256"]?.stringValue, let computedJSON = input["computed"]?.arrayValue
        else { throw HarnessError("probe vector input needs probe, artifact_sha256 and computed") }
        func verdict(_ pass: Bool, _ reason: String?) -> JSONValue {
            .object(JSONObject([("pass", .bool(pass)), ("reason", reason.map { .string($0) } ?? .null)]))
        }
        // The entry's probe_data: its declared size, and the blob as downloaded and verified.
        var tensors: Data?
        if let blob = input["probe_data"], !blob.isNull {
            guard let size = blob["size"]?.intValue, let text = blob["data"]?.stringValue, let raw = Data(base64Encoded: text)
            else { throw HarnessError("probe_data needs size and data") }
            if size > GoldenProbe.maxDataBytes { return verdict(false, Reason.malformed) }
            tensors = raw
        }
        let probe: GoldenProbe
        do {
            probe = try GoldenProbe(data: data, artifactSHA256: artifact, dataSHA256: tensors.map { SHA256Hasher.hex($0) },
                                    tensorData: tensors)
        } catch {
            return verdict(false, Reason.malformed)
        }
        var computed: [[[String: Tensor]]] = []
        for c in computedJSON {
            var steps: [[String: Tensor]] = []
            for s in c.arrayValue ?? [] {
                var outputs: [String: Tensor] = [:]
                for t in s.arrayValue ?? [] {
                    guard let named = try? GoldenProbe.tensor(t, "computed") else { throw HarnessError("a computed tensor does not parse") }
                    outputs[named.name] = named.tensor
                }
                steps.append(outputs)
            }
            computed.append(steps)
        }
        if let failure = probe.check(computed) { return verdict(false, failure.code) }
        return verdict(true, nil)
    }

    /// A `tests/vectors/labels/*.json` input: a labels blob checked and parsed.
    public static func checkLabels(_ input: JSONValue) throws(HarnessError) -> JSONValue {
        guard let sha = input["entry"]?["sha256"]?.stringValue, let size = input["entry"]?["size"]?.intValue,
            let bodyText = input["body"]?.stringValue, let body = Data(base64Encoded: bodyText)
        else { throw HarnessError("labels vector input needs entry.sha256, entry.size and a base64 body") }
        func refuse(_ reason: String) -> JSONValue { .object(JSONObject([("accept", .bool(false)), ("reason", .string(reason))])) }
        guard size <= Labels.maxBytes else { return refuse(Reason.malformed) }
        var check = BlobCheck(sha256: sha, size: size)
        do {
            try check.update(body)
            try check.finish()
        } catch {
            return refuse(error.reason)
        }
        guard let labels = Labels.parse(body) else { return refuse(Reason.malformed) }
        return .object(JSONObject([("accept", .bool(true)), ("labels", .array(labels.map { .string($0) }))]))
    }

    /// A `tests/vectors/versions/*.json` input: a version against a range.
    public static func checkVersion(_ input: JSONValue) throws(HarnessError) -> JSONValue {
        guard let version = input["version"]?.stringValue, let range = input["range"]?.stringValue else {
            throw HarnessError("versions vector input needs version and range")
        }
        return .object(JSONObject([("result", .string(DottedVersion.check(version: version, range: range)))]))
    }

    /// A `tests/vectors/reports/*.json` input: the report schema (§12) on a request body.
    public static func checkReport(_ input: JSONValue) throws(HarnessError) -> JSONValue {
        guard let bodyText = input["body"]?.stringValue, let body = Data(base64Encoded: bodyText) else {
            throw HarnessError("reports vector input needs a base64 body")
        }
        guard let refusal = ReportSchema.refusal(body) else { return .object(JSONObject([("accept", .bool(true))])) }
        return .object(JSONObject([
            ("accept", .bool(false)), ("reason", .string(refusal.reason)), ("field", refusal.field.map { .string($0) } ?? .null),
        ]))
    }
}

/// Labels blobs (docs/protocol.md §8): at most 4 MiB, strict JSON holding an array of strings.
enum Labels {
    static let maxBytes: Int64 = 4 * 1024 * 1024

    static func parse(_ data: Data) -> [String]? {
        guard let list = (try? StrictJSON.parse(data))?.arrayValue else { return nil }
        let strings = list.compactMap(\.stringValue)
        return strings.count == list.count ? strings : nil
    }
}

/// The report schema of docs/protocol.md §12, for a receiver and for the vectors.
public enum ReportSchema {
    /// The largest report a receiver reads (docs/protocol.md §12, "Size").
    public static let maxBytes = 16384

    /// The keys of schema_version 2 (docs/protocol.md §12): a report setting any says 2.
    public static let version2Keys: Set<String> = [
        "unconfirmed_starts", "cpu_class", "memory_peak_mb", "memory_steady_mb", "first_inference_ms",
    ]

    /// The key of schema_version 3 (app metrics): unknown to versions 1 and 2, even null.
    public static let version3Keys: Set<String> = ["metrics"]
    /// The largest count an app metric carries.
    public static let maxCount: Int64 = 1_000_000_000

    /// `^[a-z0-9][a-z0-9._-]{0,31}$`: a receiver stores any class of the pattern (a later one too).
    static func isCPUClass(_ s: String) -> Bool {
        let b = Array(s.utf8)
        guard (1...32).contains(b.count), Fields.isLower(b[0]) || Fields.isDigit(b[0]) else { return false }
        return b.dropFirst().allSatisfy { Fields.isLower($0) || Fields.isDigit($0) || $0 == 46 || $0 == 95 || $0 == 45 }
    }

    /// Why a body is refused (`too-large`, `not-json`, `invalid` and the key at fault), or nil.
    public static func refusal(_ body: Data) -> (reason: String, field: String?)? {
        guard body.count <= maxBytes else { return ("too-large", nil) }
        guard let value = try? StrictJSON.parse(body) else { return ("not-json", nil) }
        guard let o = value.objectValue else { return ("invalid", nil) }
        let known: Set<String> = [
            "schema_version", "token", "unit", "model", "version", "unit_version", "variant", "tier", "arm", "sequence", "probe",
            "backend", "backends_skipped", "load_ms", "load_failed", "inference", "confirmed", "reverted", "mnn_runtime", "os",
            "os_version", "device_class",
        ]
        for key in o.keys where !known.contains(key) && !version2Keys.contains(key) && !version3Keys.contains(key) {
            return ("invalid", key)
        }
        func bad(_ key: String) -> (String, String?) { ("invalid", key) }
        // A receiver takes a missing schema_version as 1 (what shipped clients send is kept).
        let schemaVersion: Int64
        if let v = o["schema_version"] {
            guard let i = v.intValue, (1...3).contains(i) else { return bad("schema_version") }
            schemaVersion = i
        } else {
            schemaVersion = 1
        }
        // A version 2 key, even null, is unknown to version 1.
        if schemaVersion == 1, let key = o.keys.first(where: version2Keys.contains) { return bad(key) }
        if schemaVersion < 3, let key = o.keys.first(where: version3Keys.contains) { return bad(key) }
        func required(_ key: String, _ ok: (JSONValue) -> Bool) -> (String, String?)? {
            guard let v = o[key], ok(v) else { return bad(key) }
            return nil
        }
        func optional(_ key: String, _ ok: (JSONValue) -> Bool) -> (String, String?)? {
            guard let v = o[key], !v.isNull else { return nil }
            return ok(v) ? nil : bad(key)
        }
        func string(_ test: @escaping (String) -> Bool) -> (JSONValue) -> Bool { { $0.stringValue.map(test) ?? false } }
        func bool(_ key: String) -> (String, String?)? {
            guard let v = o[key] else { return nil }
            return v.boolValue == nil ? bad(key) : nil
        }
        func millis(_ v: JSONValue) -> Bool {
            guard case .number(let n) = v else { return false }
            return n.double >= 0 && n.double <= 3_600_000
        }
        func megabytes(_ v: JSONValue) -> Bool {
            guard case .number(let n) = v else { return false }
            return n.double >= 0 && n.double <= Fields.maxMemoryMB
        }
        let isToken: (String) -> Bool = { $0.utf8.count == 32 && $0.utf8.allSatisfy(Fields.isHexLower) }
        let isSemver: (String) -> Bool = { SemVer($0) != nil }
        let checks: [(String, String?)?] = [
            required("token", string(isToken)),
            required("unit", string(Fields.isName)),
            required("model", string(Fields.isName)),
            required("version", string(isSemver)),
            required("unit_version", string(isSemver)),
            required("variant", string(Fields.isName)),
            required("tier", string(Fields.isName)),
            required("arm", string { $0 == "candidate" || $0 == "stable" }),
            required("sequence") { ($0.intValue ?? 0) >= 1 && ($0.intValue ?? 0) <= Fields.maxSafeInteger },
            required("probe", string { ["passed", "failed", "none"].contains($0) }),
            optional("backend", string { knownBackends.contains($0) }),
            optional("backends_skipped") { v in
                guard let list = v.arrayValue, list.count <= 8 else { return false }
                return list.allSatisfy { $0.stringValue.map { knownBackends.contains($0) } ?? false }
            },
            optional("load_ms", millis),
            bool("load_failed"),
            bool("confirmed"),
            bool("reverted"),
            optional("mnn_runtime", string { Version($0) != nil }),
            optional("os", string { $0 == "android" || $0 == "ios" }),
            optional("os_version", string { Reporter.isShortText($0) || Version($0) != nil }),
            optional("device_class", string(Reporter.isShortText)),
            optional("unconfirmed_starts") { ($0.intValue ?? -1) >= 0 && ($0.intValue ?? -1) <= 1000 },
            optional("cpu_class", string(isCPUClass)),
            optional("memory_peak_mb", megabytes),
            optional("memory_steady_mb", megabytes),
            optional("first_inference_ms", millis),
        ]
        for check in checks { if let check { return check } }
        if let inf = o["inference"], !inf.isNull {
            guard let io = inf.objectValue else { return bad("inference") }
            for key in io.keys where !["count", "p50_ms", "p90_ms", "p99_ms"].contains(key) { return ("invalid", "inference.\(key)") }
            guard let count = io["count"]?.intValue, count >= 1, count <= 1_000_000_000 else { return bad("inference.count") }
            for key in ["p50_ms", "p90_ms", "p99_ms"] {
                guard let v = io[key], millis(v) else { return bad("inference.\(key)") }
            }
        }
        if let metrics = o["metrics"], !metrics.isNull { return metricsRefusal(metrics) }
        return nil
    }

    /// `metrics`: 1 to 16 names, each `{"events", "successes"}` (a rate, successes at most events)
    /// or `{"counts": [2 to 32 counts]}` (a distribution), every count 0 to 10^9.
    static func metricsRefusal(_ value: JSONValue) -> (reason: String, field: String?)? {
        func bad(_ key: String) -> (String, String?) { ("invalid", key) }
        guard let all = value.objectValue, (1...AppMetric.maxMetrics).contains(all.keys.count) else { return bad("metrics") }
        func count(_ v: JSONValue?) -> Int64? { v?.intValue.flatMap { (0...maxCount).contains($0) ? $0 : nil } }
        for name in all.keys {
            let at = "metrics.\(name)"
            guard Fields.isName(name), let c = all[name]!.objectValue else { return bad(at) }
            // Told apart by their keys, as the reference does: counts make a distribution.
            let known = c["counts"] != nil ? ["counts"] : ["events", "successes"]
            if let counts = c["counts"] {
                guard let list = counts.arrayValue, (2...(AppMetric.maxEdges + 1)).contains(list.count) else { return bad("\(at).counts") }
                for (i, n) in list.enumerated() where count(n) == nil { return bad("\(at).counts.\(i)") }
            } else {
                for key in known where count(c[key]) == nil { return bad("\(at).\(key)") }
            }
            for key in c.keys where !known.contains(key) { return bad("\(at).\(key)") }
            if let events = count(c["events"]), let successes = count(c["successes"]), successes > events { return bad(at) }
        }
        return nil
    }
}
