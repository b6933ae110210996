// edgereg-device: the device program of docs/reference/device-program.md.
// One JSON object per line in, one per line out; logs to stderr only.
import EdgeReg
import EdgeRegTestSupport
import Foundation

let sdkVersion = "0.3.0"

struct Misuse: Error {
    let message: String
    init(_ message: String) { self.message = message }
}

func log(_ text: String) {
    FileHandle.standardError.write(Data((text + "\n").utf8))
}

func emit(_ value: JSONValue) {
    var data = CanonicalJSON.encode(value)
    data.append(0x0A)
    FileHandle.standardOutput.write(data)
}

func opt(_ s: String?) -> JSONValue { s.map { .string($0) } ?? .null }

// MARK: - the host runner adapter (ModelRunner over a JSON-lines process)

/// Speaks the host runner protocol (tests/hostrunner.py) to one child process.
actor ProcessRunner: ModelRunner {
    let command: [String]
    var process: Process?
    var input: FileHandle?
    var output: FileHandle?
    var buffer = Data()

    /// The MNN APIs the runner process calls (hostrunner.py's --api; configure's runner.mnn_apis).
    nonisolated let mnnAPIs: Set<String>

    init(command: [String], mnnAPIs: Set<String> = ["module"]) {
        self.command = command
        self.mnnAPIs = mnnAPIs
    }

    func start() throws {
        if let process, process.isRunning { return }
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        p.arguments = command
        let stdin = Pipe(), stdout = Pipe()
        p.standardInput = stdin
        p.standardOutput = stdout
        p.standardError = FileHandle.standardError
        try p.run()
        process = p
        input = stdin.fileHandleForWriting
        output = stdout.fileHandleForReading
        buffer = Data()
    }

    func request(_ message: JSONValue) throws -> JSONValue {
        try start()
        var line = CanonicalJSON.encode(message)
        line.append(0x0A)
        try input!.write(contentsOf: line)
        while true {
            if let nl = buffer.firstIndex(of: 0x0A) {
                let lineData = buffer[buffer.startIndex..<nl]
                buffer = Data(buffer[(nl + 1)...])
                guard let value = try? StrictJSON.parse(Data(lineData)) else {
                    throw Misuse("the model runner answered something that is not JSON")
                }
                return value
            }
            let chunk = output!.availableData
            if chunk.isEmpty {
                process = nil
                throw Misuse("the model runner exited")
            }
            buffer.append(chunk)
        }
    }

    nonisolated func load(model: URL, backend: String, threads: Int, precision: String, outputs: [String]) async throws -> any ModelSession {
        let answer = try await request(.object(JSONObject([
            ("op", .string("load")), ("model", .string(model.path)), ("backend", .string(backend)),
            ("threads", .int(threads)), ("precision", .string(precision)),
        ])))
        if let error = answer["error"]?.stringValue {
            if answer["unavailable"]?.boolValue == true { throw BackendUnavailable(error) }
            throw Misuse(error)
        }
        guard let session = answer["session"]?.stringValue else { throw Misuse("the model runner gave no session") }
        var shapes: [String: [Int]] = [:]
        if let declared = answer["input_shapes"]?.objectValue {
            for name in declared.keys {
                shapes[name] = declared[name]?.arrayValue?.compactMap(\.intValue).map { Int($0) }
            }
        }
        return ProcessSession(runner: self, id: session, inputShapes: shapes)
    }

    func stop() {
        if let process, process.isRunning {
            try? input?.close()
            process.waitUntilExit()
        }
        process = nil
    }
}

struct ProcessSession: ModelSession {
    let runner: ProcessRunner
    let id: String
    let inputShapes: [String: [Int]]

    func run(_ inputs: [String: Tensor]) async throws -> [String: Tensor] {
        var feeds = JSONObject()
        for (name, t) in inputs {
            feeds[name] = .object(JSONObject([
                ("dtype", .string(t.dtype)), ("shape", .array(t.shape.map { .int($0) })),
                ("data", .string(t.data.base64EncodedString())),
            ]))
        }
        let answer = try await runner.request(.object(JSONObject([
            ("op", .string("run")), ("session", .string(id)), ("inputs", .object(feeds)),
        ])))
        if let error = answer["error"]?.stringValue { throw Misuse(error) }
        guard let outputs = answer["outputs"]?.objectValue else { throw Misuse("the model runner gave no outputs") }
        var out: [String: Tensor] = [:]
        for name in outputs.keys {
            let o = outputs[name]!
            guard let dtype = o["dtype"]?.stringValue, let shape = o["shape"]?.arrayValue?.compactMap(\.intValue),
                let data = o["data"]?.stringValue.flatMap({ Data(base64Encoded: $0) })
            else { throw Misuse("the model runner gave a malformed output \(name)") }
            out[name] = Tensor(dtype: dtype, shape: shape.map { Int($0) }, data: data)
        }
        return out
    }

    func close() async {
        _ = try? await runner.request(.object(JSONObject([("op", .string("close")), ("session", .string(id))])))
    }
}

// MARK: - the program

/// What a background update and the client's listener leave for the harness to read.
final class Recorder: @unchecked Sendable {
    private let lock = NSLock()
    private var _progress: [JSONValue] = []
    private var _events: [JSONValue] = []

    func progress(_ done: Int64, _ total: Int64) { lock.withLock { _progress.append(.array([.int(done), .int(total)])) } }
    func takeProgress() -> [JSONValue] { lock.withLock { defer { _progress = [] }; return _progress } }

    func event(_ change: ModelChange) {
        let e = JSONValue.object(JSONObject([
            ("unit", .string(change.unit.name)), ("kind", .string(change.kind.rawValue)),
            ("version", change.version.map { .string($0) } ?? .null), ("previous", change.previous.map { .string($0) } ?? .null),
        ]))
        lock.withLock { _events.append(e) }
    }
    func takeEvents() -> [JSONValue] { lock.withLock { defer { _events = [] }; return _events } }
}

final class Device {
    var client: EdgeRegClient?
    var unit: ReleaseUnit = .model("")
    var runner: ProcessRunner?
    var background: Task<UpdateResult, Never>?
    let recorder = Recorder()

    func handle(_ request: JSONObject) async throws -> JSONValue? {
        guard let op = request["op"]?.stringValue else { throw Misuse("no 'op'") }
        switch op {
        case "hello":
            return .object(JSONObject([("client", .string("swift")), ("sdk_version", .string(sdkVersion))]))
        case "decide":
            guard let vector = request["vector"] else { throw Misuse("decide needs 'vector'") }
            do { return try Conformance.decide(vector) } catch { throw Misuse(error.description) }
        case "check_blob":
            guard let vector = request["vector"] else { throw Misuse("check_blob needs 'vector'") }
            do { return try Conformance.checkBlob(vector) } catch { throw Misuse(error.description) }
        case "check_probe", "check_version", "check_report", "check_labels":
            guard let vector = request["vector"] else { throw Misuse("\(op) needs 'vector'") }
            do {
                switch op {
                case "check_probe": return try Conformance.checkProbe(vector)
                case "check_version": return try Conformance.checkVersion(vector)
                case "check_report": return try Conformance.checkReport(vector)
                default: return try Conformance.checkLabels(vector)
                }
            } catch {
                throw Misuse(error.description)
            }
        case "check_conditions", "check_selftest", "check_tiers", "check_health", "check_metrics", "check_hints":
            guard let vector = request["vector"] else { throw Misuse("\(op) needs 'vector'") }
            do {
                switch op {
                case "check_conditions": return try Conformance.checkConditions(vector)
                case "check_selftest": return try Conformance.checkSelfTest(vector)
                case "check_health": return try Conformance.checkHealth(vector)
                case "check_metrics": return try Conformance.checkMetrics(vector)
                case "check_hints": return try Conformance.checkHints(vector)
                default: return try Conformance.checkTierFile(vector)
                }
            } catch {
                throw Misuse(error.description)
            }
        case "resolve_tier":
            guard let tiers = request["tiers"].flatMap(Conformance.tiers), let d = request["device"]?.objectValue else {
                throw Misuse("resolve_tier needs 'tiers' (an array) and 'device'")
            }
            let device = DeviceFacts(deviceID: "d", ramMB: d["ram_mb"]?.intValue, cpuCores: d["cpu_cores"]?.intValue,
                                     soc: d["soc"]?.stringValue, os: d["os"]?.stringValue)
            return .object(JSONObject([("tier", Tiers.resolve(tiers, device).map { .string($0.tier) } ?? .null)]))
        case "cohort":
            guard let salt = request["salt"]?.stringValue, let id = request["device_id"]?.stringValue,
                let percents = request["percents"]?.arrayValue?.compactMap(\.stringValue)
            else { throw Misuse("cohort needs 'salt', 'device_id' and 'percents'") }
            return Conformance.cohort(salt: salt, deviceID: id, percents: percents)
        case "check_json":
            guard let text = request["data"]?.stringValue, let data = Data(base64Encoded: text) else {
                throw Misuse("check_json needs base64 'data'")
            }
            return .object(JSONObject([("valid", .bool(StrictJSON.isValid(data)))]))
        case "configure":
            return try await configure(request)
        case "quit":
            return nil
        default:
            break
        }
        guard let client else {
            if ["set_clock", "update", "start_update", "cancel", "wait_update", "events", "check", "delete", "installed", "current", "status", "app_started", "confirm", "record_inference", "record_memory", "record", "observe", "revert", "flush"].contains(op) {
                throw Misuse("'\(op)' before 'configure'")
            }
            throw Misuse("unknown op '\(op)'")
        }
        switch op {
        case "set_clock":
            guard let text = request["now"]?.stringValue, let now = WireTime.parseLenient(text) else {
                throw Misuse("set_clock needs an RFC 3339 'now'")
            }
            await client.setClock(now)
            return .object(JSONObject())
        case "update":
            return resultJSON(await client.update(unit, conditions: conditions(request)))
        case "start_update":
            if background != nil { throw Misuse("an update was started: wait_update first") }
            let said = conditions(request), unit = self.unit, recorder = self.recorder
            _ = recorder.takeProgress()
            background = Task { await client.update(unit, conditions: said, progress: { recorder.progress($0, $1) }) }
            return .object(JSONObject())
        case "cancel":
            background?.cancel()
            return .object(JSONObject())
        case "wait_update":
            guard let background else { throw Misuse("no update was started") }
            let result = await background.value
            self.background = nil
            guard case .object(var o) = resultJSON(result) else { throw Misuse("no result") }
            o["progress"] = .array(recorder.takeProgress())
            return .object(o)
        case "events":
            return .object(JSONObject([("events", .array(recorder.takeEvents()))]))
        case "check":
            let c = await client.check(unit, conditions: conditions(request))
            return .object(JSONObject([
                ("available", .bool(c.available)), ("version", opt(c.version)), ("installed", opt(c.installed)),
                ("is_candidate", .bool(c.isCandidate)), ("download_bytes", .int(c.downloadBytes)), ("deferred", opt(c.deferred)),
                ("fallback", opt(c.fallback)), ("error_code", opt(c.errorCode)),
            ]))
        case "delete":
            return .object(JSONObject([("deleted", .bool(await client.delete(unit)))]))
        case "installed":
            let units = await client.installedUnits().map { u -> JSONValue in
                .object(JSONObject([
                    ("unit", .string(u.unit.name)), ("kind", .string(u.unit.isBundle ? "bundle" : "model")),
                    ("version", .string(u.version)), ("is_candidate", .bool(u.isCandidate)),
                ]))
            }
            return .object(JSONObject([("units", .array(units))]))
        case "current":
            return resultJSON(await client.current(unit))
        case "status":
            return statusJSON(await client.status(unit))
        case "app_started":
            let outcome = await client.appStarted(unit)
            return .object(JSONObject([
                ("reverted", .bool(outcome.reverted)), ("version", opt(outcome.version)), ("reason", opt(outcome.reason)),
            ]))
        case "confirm":
            let confirmed = await client.confirm(unit, version: request["version"]?.stringValue)
            return .object(JSONObject([("confirmed", .bool(confirmed))]))
        case "record_inference":
            guard let ms = request["ms"]?.doubleValue else { throw Misuse("record_inference needs 'ms'") }
            await client.recordInference(unit, ms: ms, model: request["model"]?.stringValue)
            return .object(JSONObject())
        case "record_memory":
            func mb(_ key: String) throws -> Double? {
                guard let v = request[key], !v.isNull else { return nil }
                guard let n = v.doubleValue else { throw Misuse("record_memory '\(key)' is not a number") }
                return n
            }
            await client.recordMemory(unit, peakMB: try mb("peak_mb"), steadyMB: try mb("steady_mb"), model: request["model"]?.stringValue)
            return .object(JSONObject())
        case "record", "observe":
            // Counted, or the programming error the app would catch at the call site; never a crash.
            guard let metric = request["metric"]?.stringValue else { throw Misuse("\(op) needs 'metric'") }
            let success = request["success"]?.boolValue
            if op == "record", success == nil { throw Misuse("record needs 'success' (true or false)") }
            let value = observed(request["value"])
            if op == "observe", value == nil { throw Misuse("observe needs 'value': a number, or \"NaN\", \"Infinity\", \"-Infinity\"") }
            do {
                let counted = op == "record" ? try client.record(unit, metric, success: success!) : try client.observe(unit, metric, value!)
                return .object(JSONObject([("counted", .bool(counted))]))
            } catch {
                return .object(JSONObject([("counted", .bool(false)), ("error", .string(error.message))]))
            }
        case "revert":
            return resultJSON(await client.revert(unit, reason: request["reason"]?.stringValue ?? "reverted by the app"))
        case "flush":
            return .object(JSONObject([("sent", .int(await client.flushReports()))]))
        default:
            throw Misuse("unknown op '\(op)'")
        }
    }

    /// observe's value: a JSON number, or "NaN", "Infinity", "-Infinity" (which JSON cannot carry).
    func observed(_ v: JSONValue?) -> Double? {
        if let n = v?.doubleValue { return n }
        switch v?.stringValue {
        case "NaN": return .nan
        case "Infinity": return .infinity
        case "-Infinity": return -.infinity
        default: return nil
        }
    }

    /// Absent, or a key left out: the app did not say it, which counts as unmet (§8).
    func conditions(_ request: JSONObject) -> Conditions {
        let c = request["conditions"]?.objectValue ?? JSONObject()
        return Conditions(metered: c["metered"]?.boolValue, charging: c["charging"]?.boolValue, idle: c["idle"]?.boolValue,
                          storageLow: c["storage_low"]?.boolValue)
    }

    func configure(_ r: JSONObject) async throws -> JSONValue {
        guard let registryText = r["registry"]?.stringValue, let registry = URL(string: registryText) else {
            throw Misuse("configure needs 'registry'")
        }
        guard let pems = r["trusted_keys"]?.arrayValue?.compactMap(\.stringValue), let trusted = TrustedKeys(pems: pems) else {
            throw Misuse("configure needs 'trusted_keys' (Ed25519 PEM public keys)")
        }
        guard let cacheDir = r["cache_dir"]?.stringValue, let unitName = r["unit"]?.stringValue else {
            throw Misuse("configure needs 'cache_dir' and 'unit'")
        }
        guard let d = r["device"]?.objectValue, let deviceID = d["device_id"]?.stringValue else {
            throw Misuse("configure needs 'device.device_id'")
        }
        var device = DeviceFacts(
            deviceID: deviceID, ramMB: d["ram_mb"]?.intValue, cpuCores: d["cpu_cores"]?.intValue, soc: d["soc"]?.stringValue,
            os: d["os"]?.stringValue, osVersion: d["os_version"]?.stringValue, mnnRuntime: d["mnn_runtime"]?.stringValue,
            appVersion: r["app_version"]?.stringValue ?? d["app_version"]?.stringValue)
        // Absent or null: the SDK's default (read from the platform); a list says them.
        if let features = r["cpu_features"], !features.isNull {
            do { device.cpuFeatures = try Conformance.cpuFeatures(features) } catch { throw Misuse(error.description) }
        }
        if let budget = r["memory_budget_mb"], !budget.isNull {
            guard let mb = budget.doubleValue else { throw Misuse("'memory_budget_mb' is not a number") }
            device.memoryBudgetMB = mb
        }
        if let problem = device.problem { throw Misuse("the client refused the configuration: \(problem)") }
        var tiers: [(String, TierRules)] = []
        if let t = r["tiers"], !t.isNull {
            guard let parsed = Conformance.tiers(t) else { throw Misuse("'tiers' are not tier rules") }
            tiers = parsed
        }
        let tier = r["tier"]?.stringValue
        if tier == nil, tiers.isEmpty { throw Misuse("configure needs 'tier' or 'tiers'") }
        if let old = runner { await old.stop() }
        runner = nil
        if let command = r["runner"]?["command"]?.arrayValue?.compactMap(\.stringValue), !command.isEmpty {
            // The MNN APIs the runner calls (fit rule (f)); hostrunner.py's default is the Module API.
            let apis = r["runner"]?["mnn_apis"]?.arrayValue?.compactMap(\.stringValue)
            runner = ProcessRunner(command: command, mnnAPIs: Set(apis ?? ["module"]))
        }
        var policy = DownloadPolicy()
        if let p = r["policy"]?.objectValue {
            policy.allowMetered = p["allow_metered"]?.boolValue ?? true
            policy.requireCharging = p["require_charging"]?.boolValue ?? false
            policy.requireIdle = p["require_idle"]?.boolValue ?? false
            policy.requireStorageNotLow = p["require_storage_not_low"]?.boolValue ?? false
            policy.reserveBytes = p["reserve_bytes"]?.intValue ?? policy.reserveBytes
        }
        var limits = Limits()
        if let v = r["timeout_s"]?.doubleValue { limits.timeout = v }
        if let v = r["deadline_s"]?.doubleValue { limits.deadline = v }
        if let v = r["min_rate"]?.doubleValue { limits.minRate = v }
        var bundled: [String: BundledRelease] = [:]
        if let b = r["bundled"]?.objectValue {
            guard let manifestPath = b["manifest"]?.stringValue, let blobs = b["blobs_dir"]?.stringValue,
                let manifest = FileManager.default.contents(atPath: manifestPath)
            else { throw Misuse("'bundled' needs a readable 'manifest' and 'blobs_dir'") }
            bundled[unitName] = BundledRelease(manifest: manifest, blobsDirectory: URL(fileURLWithPath: blobs))
        }
        let config = ClientConfiguration(
            registry: registry, trustedKeys: trusted, cacheDirectory: URL(fileURLWithPath: cacheDir), device: device, tier: tier,
            tiers: tiers, runner: runner, selfTest: r["self_test"]?.boolValue ?? false, policy: policy, limits: limits,
            reporting: r["reporting"]?.boolValue ?? true, deviceClass: r["device_class"]?.stringValue,
            maxUnconfirmedStarts: Int(r["max_unconfirmed_starts"]?.intValue ?? 3), bundled: bundled,
            transport: r["source_address"]?.stringValue.map { SocketTransport(source: $0, deadline: limits.deadline) })
        // As an app's would, the client refuses a configuration it cannot run (the device program
        // answers ok: false where an app would stop at a precondition).
        if let problem = config.problem { throw Misuse("the client refused the configuration: \(problem)") }
        let client = EdgeRegClient(config)
        let recorder = self.recorder
        await client.addListener { recorder.event($0) }
        guard client.tier != nil else { throw Misuse("the client refused the configuration: \(client.tierReason)") }
        if let nowText = r["now"]?.stringValue {
            guard let now = WireTime.parseLenient(nowText) else { throw Misuse("'now' is not an RFC 3339 time") }
            await client.setClock(now)
        }
        self.client = client
        unit = r["bundle"]?.boolValue == true ? .bundle(unitName) : .model(unitName)
        return .object(JSONObject([("tier", opt(client.tier)), ("tier_reason", .string(client.tierReason))]))
    }

    func resultJSON(_ r: UpdateResult) -> JSONValue {
        if let code = r.errorCode { log("edgereg-device: \(r.unit): \(code): \(r.error ?? "")") }
        var members = JSONObject()
        for name in r.members.keys.sorted() {
            let m = r.members[name]!
            members[name] = .object(JSONObject([
                ("version", .string(m.version)), ("variant", .string(m.variant)), ("sha256", .string(m.sha256)),
                ("path", .string(m.path.path)), ("backend", opt(m.backend)),
            ]))
        }
        return .object(JSONObject([
            ("ok", .bool(r.ok)), ("error_code", opt(r.errorCode)), ("error", opt(r.error)), ("version", opt(r.version)),
            ("is_candidate", .bool(r.isCandidate)), ("updated", .bool(r.updated)), ("not_modified", .bool(r.notModified)),
            ("runtime_fallback", .bool(r.runtimeFallback)), ("fallback", opt(r.fallback)),
            ("substitute", opt(r.substitute)), ("deferred", opt(r.deferred)),
            ("bundled", .bool(r.bundled)), ("downloaded_bytes", .int(r.downloadedBytes)), ("members", .object(members)),
        ]))
    }

    func statusJSON(_ s: UnitStatus) -> JSONValue {
        func set(_ info: UnitStatus.SetInfo?) -> JSONValue {
            guard let info else { return .null }
            var members = JSONObject()
            for name in info.members.keys.sorted() {
                let m = info.members[name]!
                members[name] = .object(JSONObject([("version", .string(m.version)), ("sha256", .string(m.sha256))]))
            }
            return .object(JSONObject([("version", .string(info.version)), ("members", .object(members))]))
        }
        var pending: JSONValue = .null
        if let p = s.pending {
            pending = .object(JSONObject([
                ("version", .string(p.version)), ("is_candidate", .bool(p.isCandidate)), ("total_bytes", .int(p.totalBytes)),
                ("remaining_bytes", .int(p.remainingBytes)), ("deferred", opt(p.deferred)), ("since", .string(p.since)),
            ]))
        }
        return .object(JSONObject([
            ("installed", set(s.installed)), ("last_good", set(s.previous)), ("pending", pending),
            ("last_error_code", opt(s.lastError?.code)),
            ("refused", .array(s.badReleases.keys.sorted().map { .string($0) })), ("ready", .bool(s.ready)),
        ]))
    }
}

let device = Device()
while let line = readLine(strippingNewline: true) {
    if line.trimmingCharacters(in: .whitespaces).isEmpty { continue }
    var id: JSONValue = .null
    do {
        guard let request = try? StrictJSON.parse(Data(line.utf8)).objectValue else { throw Misuse("not a JSON object") }
        id = request["id"] ?? .null
        let result = try await device.handle(request)
        guard let result else {
            emit(.object(JSONObject([("id", id), ("ok", .bool(true)), ("result", .object(JSONObject()))])))
            break
        }
        emit(.object(JSONObject([("id", id), ("ok", .bool(true)), ("result", result)])))
    } catch {
        let message = (error as? Misuse)?.message ?? "\(error)"
        emit(.object(JSONObject([("id", id), ("ok", .bool(false)), ("error", .object(JSONObject([("message", .string(message))])))])))
    }
}
if let runner = device.runner { await runner.stop() }
exit(0)
