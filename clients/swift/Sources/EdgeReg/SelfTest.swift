import Foundation

/// What the self-test of one member found (docs/protocol.md §11, rules 15–19).
struct SelfTestOutcome: Sendable {
    /// The backend chosen, nil when every backend failed (`probe-failed`).
    var backend: String?
    /// Backends that failed now or before (remembered), in order.
    var skipped: [String] = []
    /// Backends this device lacks.
    var unavailable: [String] = []
    /// Why each tried backend failed.
    var failures: [String] = []
    var loadMs: Double?
    var probed = false
    /// The runner could not create the CPU: the probe did not run, no verdict (rule 20).
    var notRun = false
    var unavailableWhy: [String] = []
    var why: String { (failures + unavailableWhy).joined(separator: "; ") }
}

/// The verdict of a self-test's trials in the entry's backend order (docs/protocol.md §11, rules
/// 15–20): each (backend, kind) with kind `passed`, `loaded` (no probe), `failed`,
/// `load-failed`, `unavailable` or `remembered`.
public enum SelfTestVerdict {
    public static func judge(_ trials: [(backend: String, kind: String)]) -> (verdict: String, backend: String?) {
        if let chosen = trials.first(where: { $0.kind == "passed" || $0.kind == "loaded" }) { return ("install", chosen.backend) }
        guard let cpu = trials.last(where: { $0.backend == "cpu" }), cpu.kind != "unavailable" else { return ("not-run", nil) }
        return ("reject", nil)
    }
}

/// Runs a model's golden probe on each hinted backend through the app's runner, CPU last.
struct SelfTest {
    let layout: CacheLayout
    let runner: (any ModelRunner)?

    func run(model: String, artifact: URL, entry: ModelEntry, probe: GoldenProbe?) async -> SelfTestOutcome {
        var memory = (try? Files.readJSON(layout.selfTestFile)) ?? JSONObject()
        var perModel = memory[model]?.objectValue ?? JSONObject()
        var record = perModel[entry.version]?.objectValue ?? JSONObject()
        if record["sha256"]?.stringValue != entry.sha256 { record = JSONObject([("sha256", .string(entry.sha256))]) }
        var outcome = SelfTestOutcome()
        outcome.probed = probe != nil
        if let rejected = record["rejected"]?.stringValue {
            outcome.failures = ["rejected before on this device: \(rejected)"]
            return outcome
        }
        var failed = record["failed"]?.objectValue ?? JSONObject()
        let before = failed
        var trials: [(backend: String, kind: String)] = []
        for backend in entry.runtime.backends {
            if let why = failed[backend]?.stringValue {
                // Rule 15: known to fail for this version on this device.
                outcome.skipped.append(backend)
                outcome.failures.append("\(backend): \(why) (remembered)")
                trials.append((backend, "remembered"))
                continue
            }
            switch await trial(artifact: artifact, backend: backend, entry: entry, probe: probe) {
            case .unavailable(let why):
                outcome.unavailable.append(backend)
                outcome.unavailableWhy.append("\(backend): unavailable (\(why))")
                trials.append((backend, "unavailable"))
            case .failed(let why):
                failed[backend] = .string(why)
                outcome.skipped.append(backend)
                outcome.failures.append("\(backend): \(why)")
                trials.append((backend, why.hasPrefix("does not load") ? "load-failed" : "failed"))
            case .passed(let loadMs):
                outcome.backend = backend
                outcome.loadMs = loadMs
                trials.append((backend, "passed"))
            }
            if outcome.backend != nil { break }
        }
        if outcome.backend == nil, SelfTestVerdict.judge(trials).verdict == "not-run" {
            // The runner cannot create the CPU: no verdict on the model, nothing marked bad.
            outcome.notRun = true
            if failed != before {
                record["failed"] = .object(failed)
                perModel[entry.version] = .object(record)
                memory[model] = .object(perModel)
                try? Files.writeJSON(memory, to: layout.selfTestFile)
            }
            return outcome
        }
        if outcome.backend == nil {
            record["failed"] = .object(failed)
            record["rejected"] = .string(outcome.why.isEmpty ? "no backend" : outcome.why)
        } else if failed != before {
            record["failed"] = .object(failed)
        } else {
            return outcome
        }
        perModel[entry.version] = .object(record)
        memory[model] = .object(perModel)
        try? Files.writeJSON(memory, to: layout.selfTestFile)
        return outcome
    }

    enum Trial {
        case unavailable(String)
        case failed(String)
        case passed(loadMs: Double)
    }

    func trial(artifact: URL, backend: String, entry: ModelEntry, probe: GoldenProbe?) async -> Trial {
        guard let runner else { return .unavailable("the app gave no model runner") }
        var outputs: [String] = []
        if let first = probe?.cases.first?.first {
            outputs = first.expected.map(\.name)
            for pair in probe?.state ?? [] where !outputs.contains(pair.output) { outputs.append(pair.output) }
        }
        let started = Date()
        let session: any ModelSession
        do {
            session = try await runner.load(model: artifact, backend: backend, threads: entry.runtime.threads,
                                            precision: entry.runtime.precision, outputs: outputs)
        } catch let e as BackendUnavailable {
            return .unavailable(e.message)
        } catch {
            return .failed("does not load: \(error)")
        }
        let loadMs = Date().timeIntervalSince(started) * 1000
        defer { Task { await session.close() } }
        guard let probe else { return .passed(loadMs: loadMs) }
        for (ci, steps) in probe.cases.enumerated() {
            var state: [String: Tensor] = [:]
            for pair in probe.state {
                // Zeros of the shape the model declares: its contract (a named axis counts 1),
                // else what the runtime says (a dynamic axis, -1 or 0, counts 1).
                let shape: [Int], dtype: String
                if let spec = entry.contract?.inputs.first(where: { $0.spec.name == pair.input })?.spec {
                    shape = spec.shape.map { dim -> Int in if case .size(let n) = dim { return Int(n) } else { return 1 } }
                    dtype = spec.dtype
                } else if let declared = session.inputShapes[pair.input] {
                    shape = declared.map { $0 <= 0 ? 1 : $0 }
                    dtype = "float32"
                } else {
                    return .failed("does not run: the model declares no state input \(pair.input)")
                }
                var count = 1
                for d in shape {
                    let (p, overflow) = count.multipliedReportingOverflow(by: d)
                    guard !overflow, p <= 1 << 28 else { return .failed("does not run: state \(pair.input) of shape \(shape) is too large") }
                    count = p
                }
                state[pair.input] = Tensor.zeros(dtype: dtype, shape: shape)
            }
            for (si, step) in steps.enumerated() {
                var feeds: [String: Tensor] = [:]
                for t in step.inputs { feeds[t.name] = t.tensor }
                for (k, v) in state { feeds[k] = v }
                let outputs: [String: Tensor]
                do {
                    outputs = try await session.run(feeds)
                } catch {
                    return .failed("does not run: \(error)")
                }
                for pair in probe.state {
                    guard let next = outputs[pair.output] else {
                        return .failed("does not run: the model returned no state output \(pair.output)")
                    }
                    state[pair.input] = next
                }
                if let miss = probe.check(step: step, outputs: outputs, where: "case \(ci + 1) step \(si + 1)") {
                    return .failed("\(miss.code): \(miss.detail)")
                }
            }
        }
        return .passed(loadMs: loadMs)
    }
}

/// The confirmation ledger of one unit (docs/protocol.md §11): `starts` counts the app starts
/// that ran the install and ended without a confirmation, at the next start (`running`: a start
/// that runs it is under way), so an app that installs before or after `appStarted` counts alike.
struct UnitHealth: Sendable, Equatable {
    struct Revert: Sendable, Equatable {
        var unit: String
        var version: String
        var toVersion: String?
        var starts: Int
        var reason: String { "\(unit) \(version) not confirmed after \(starts) app starts" }
    }

    var installed: String?
    var confirmed = false
    var starts = 0
    var running = false
    var lastGood: String?
    var reverting: Revert?

    init() {}

    /// `duringStart`: `appStarted` was called in this process before, so this start may run
    /// the new version and the next start counts it unless it is confirmed.
    mutating func onInstall(_ version: String, duringStart: Bool = false) {
        guard version != installed else { return }
        installed = version
        confirmed = false
        starts = 0
        running = duringStart
    }

    /// A start: the one under way before it (`running`) ended unconfirmed and counts one; the
    /// revert due when the count reached `maxStarts` (this start must not load it), if any.
    mutating func onStart(unit: String, maxStarts: Int) -> Revert? {
        if let reverting { return reverting }
        guard let installed, !confirmed else { return nil }
        if running { starts += 1 }
        if starts >= maxStarts {
            let revert = Revert(unit: unit, version: installed, toVersion: lastGood, starts: starts)
            reverting = revert
            running = false
            return revert
        }
        running = true
        return nil
    }

    mutating func onConfirm(_ version: String?) -> Bool {
        guard let installed, !confirmed, reverting == nil else { return false }
        if let version, version != installed { return false }
        confirmed = true
        running = false
        lastGood = installed
        return true
    }

    mutating func onReverted(to version: String?) {
        installed = version
        confirmed = version != nil && version == lastGood
        starts = 0
        running = false
        reverting = nil
    }

    var json: JSONValue {
        var o = JSONObject()
        o["installed"] = installed.map { .string($0) } ?? .null
        o["confirmed"] = .bool(confirmed)
        o["starts"] = .int(starts)
        o["running"] = .bool(running)
        o["last_good"] = lastGood.map { .string($0) } ?? .null
        if let r = reverting {
            o["reverting"] = .object(JSONObject([
                ("unit", .string(r.unit)), ("version", .string(r.version)), ("to_version", r.toVersion.map { .string($0) } ?? .null), ("starts", .int(r.starts)),
            ]))
        } else {
            o["reverting"] = .null
        }
        return .object(o)
    }

    init(json: JSONValue) {
        installed = json["installed"]?.stringValue
        confirmed = json["confirmed"]?.boolValue ?? false
        starts = Int(json["starts"]?.intValue ?? 0)
        // A ledger written before this key counted each start as it began: nothing to add.
        running = json["running"]?.boolValue ?? false
        lastGood = json["last_good"]?.stringValue
        if let r = json["reverting"]?.objectValue, let v = r["version"]?.stringValue {
            reverting = Revert(unit: r["unit"]?.stringValue ?? "", version: v, toVersion: r["to_version"]?.stringValue,
                               starts: Int(r["starts"]?.intValue ?? 0))
        }
    }
}
