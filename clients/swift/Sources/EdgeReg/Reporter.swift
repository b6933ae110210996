import Foundation

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// What a report says about one installed model (docs/protocol.md §11, schema in
/// edgereg/protocol/reports.py). No device id: `token` is random per install.
struct ReportFacts: Sendable, Equatable, Codable {
    var token: String
    var unit: String
    var model: String
    var version: String
    var unitVersion: String
    var variant: String
    var tier: String
    var arm: String
    var sequence: Int64
    var probe: String
    var backend: String?
    var backendsSkipped: [String]
    var loadMs: Double?
    var loadFailed: Bool
    var confirmed = false
    var reverted = false
    // Version 2 (docs/protocol.md §12): nil leaves the key off, so a report setting none of
    // them is byte for byte a version 1 report.
    var unconfirmedStarts: Int?
    var memoryPeakMB: Double?
    var memorySteadyMB: Double?
    var firstInferenceMs: Double?
    // Version 3: the install's app metrics so far (nil before any count).
    var metrics: [String: MetricTotal]?
}

/// Sends reports in the background, one at a time in the order made; never a reason to fail,
/// delay or retry an update (docs/protocol.md §11).
///
/// The reports made are kept per unit, model and unit version in `reports.json`: the installed
/// release's, which a confirmation, a start or a memory figure reports again (after an app
/// restart too), and those of releases refused here (rejected by the self-test, or reverted),
/// which every later rollout period reports again with no latency. A report not delivered (no
/// answer, 408, 429, 5xx) is kept too and sent again at each update check until it is
/// delivered, a newer report of the same (token, model) replaces it, or five tries were
/// answered with 408, 429 or 5xx (a try with no answer does not count); at most 16 wait, the
/// oldest go first; any other 4xx is a refusal, dropped at once.
actor Reporter {
    static let timeout = 5.0
    /// Reports kept per unit/model/unit version (an installed release's is never dropped).
    static let keptReports = 64
    /// Reports waiting for delivery at most; the oldest go first.
    static let keptUndelivered = 16
    /// Tries answered with 408, 429 or 5xx after which an undelivered report is dropped.
    static let answeredTries = 5

    let enabled: Bool
    let transport: any Transport
    let registry: URL
    let device: DeviceFacts
    let deviceClass: String?
    /// reports.json in the cache directory (nil: kept in memory only).
    let store: URL?
    /// The app metrics counted per install (nil: reporting off, nothing counted).
    let counts: MetricCounts?
    let clock: ClientClock
    /// The reports made, per unit/model/unit version.
    var made: [String: Made] = [:]
    /// unit/model: the key in `made` of the installed release's report.
    var installedKeys: [String: String] = [:]
    /// Reports not delivered yet, oldest first.
    var undelivered: [Pending] = []
    /// Serials of the tries started and not finished.
    var inFlight: Set<Int> = []
    /// token/model: the serial of the newest report made by this process.
    var newest: [String: Int] = [:]
    var serial = 0
    /// Latency samples per unit/model since its last report.
    var samples: [String: [Double]] = [:]
    /// The first call recorded per unit/model since its install (or since this process
    /// started), until a report carries it as the install's `first_inference_ms`.
    var firstPending: [String: Double] = [:]
    var firstSeen: Set<String> = []
    /// The last try queued: each try waits for the one before (in the order made).
    var tail: Task<Void, Never>?
    var started = 0
    var delivered = 0

    /// A report made, kept to be made again: where it goes, whether its release was refused
    /// here, and when it was last made (the least recently made go first).
    struct Made: Codable, Sendable {
        var facts: ReportFacts
        var url: String
        var refused: Bool
        var made: Int
        /// When it was last made (the client's clock, seconds since 1970; nil: before this was kept).
        var madeAt: Int64?
    }

    /// One report's bytes on their way to the collector.
    struct Pending: Sendable {
        let body: Data
        let url: URL
        let identity: String
        let serial: Int
        var tries: Int
    }

    init(enabled: Bool, transport: any Transport, registry: URL, device: DeviceFacts, deviceClass: String?, store: URL? = nil,
         counts: MetricCounts? = nil, clock: ClientClock = ClientClock()) {
        self.counts = enabled ? counts : nil
        self.clock = clock
        self.store = store
        self.enabled = enabled
        self.transport = transport
        self.registry = registry
        self.device = device
        self.deviceClass = deviceClass
        guard enabled, let store, let data = try? Data(contentsOf: store), let saved = try? JSONDecoder().decode(Saved.self, from: data) else {
            return
        }
        var reports = saved.reports ?? [:]
        var pointers = (saved.installed ?? [:]).filter { reports[$0.value] != nil }
        // Written by an SDK before 0.3: the installed releases' reports, per unit/model.
        for (unitModel, old) in saved.latest ?? [:] {
            let key = Reporter.key(old.facts.unit, old.facts.model, old.facts.unitVersion)
            reports[key] = Made(facts: old.facts, url: old.url, refused: false, made: 0)
            pointers[unitModel] = key
        }
        var count = reports.values.map(\.made).max() ?? 0
        var waiting: [Pending] = []
        for r in saved.undelivered ?? saved.retry ?? [] {
            guard let url = URL(string: r.url) else { continue }
            count += 1
            waiting.append(Pending(body: r.body, url: url, identity: Reporter.identity(r.body), serial: count, tries: r.tries ?? 0))
        }
        made = reports
        installedKeys = pointers
        undelivered = waiting
        serial = count
    }

    static func key(_ unit: String, _ model: String, _ unitVersion: String) -> String { "\(unit)/\(model)/\(unitVersion)" }

    static func newToken() -> String {
        var bytes = [UInt8](repeating: 0, count: 16)
        var rng = SystemRandomNumberGenerator()
        for i in bytes.indices { bytes[i] = rng.next() }
        return Data(bytes).hexString
    }

    /// `report_url` resolved against the registry root, or as given when absolute.
    func resolve(_ reportURL: String?) -> URL? {
        guard let reportURL else { return nil }
        if reportURL.hasPrefix("http://") || reportURL.hasPrefix("https://") { return URL(string: reportURL) }
        return URL(string: reportURL, relativeTo: registry)?.absoluteURL
    }

    struct OldSaved: Codable {
        var facts: ReportFacts
        var url: String
    }

    struct Retry: Codable {
        var body: Data
        var url: String
        var tries: Int?
    }

    /// reports.json: the reports made (`latest`, `retry`: as an SDK before 0.3 wrote them).
    struct Saved: Codable {
        var reports: [String: Made]?
        var installed: [String: String]?
        var undelivered: [Retry]?
        var latest: [String: OldSaved]?
        var retry: [Retry]?
    }

    func save() {
        guard let store else { return }
        while made.count > Reporter.keptReports {
            let kept = Set(installedKeys.values)
            guard let oldest = made.filter({ !kept.contains($0.key) }).min(by: { $0.value.made < $1.value.made })?.key else { break }
            made[oldest] = nil
        }
        let saved = Saved(reports: made, installed: installedKeys,
                          undelivered: undelivered.map { Retry(body: $0.body, url: $0.url.absoluteString, tries: $0.tries) })
        if let data = try? JSONEncoder().encode(saved) { try? Files.atomicWrite(data, to: store) }
    }

    /// A member's first report after an install, or after a rejection (`refused`): an install's
    /// becomes the one a confirmation or a start reports again; a rejection's is kept for the
    /// later rollout periods, with no latency (the calls ran on the release still installed).
    func installed(_ facts: ReportFacts, reportURL: String?, refused: Bool = false) {
        guard enabled, let url = resolve(reportURL) else { return }
        let unitModel = "\(facts.unit)/\(facts.model)"
        let key = Reporter.key(facts.unit, facts.model, facts.unitVersion)
        if !refused {
            // A new install: its first inference is the next one recorded.
            firstSeen.remove(unitModel)
            firstPending[unitModel] = nil
            installedKeys[unitModel] = key
        }
        made[key] = Made(facts: facts, url: url.absoluteString, refused: refused, made: 0)
        send(key, inference: refused ? nil : latency(unitModel))
        save()
    }

    /// Report the installed release again with what changed; kept in its later reports.
    func changed(unit: String, model: String, confirmed: Bool = false,
                 unconfirmedStarts: Int? = nil, memoryPeakMB: Double? = nil, memorySteadyMB: Double? = nil) {
        let unitModel = "\(unit)/\(model)"
        guard enabled, let key = installedKeys[unitModel], var entry = made[key] else { return }
        if confirmed { entry.facts.confirmed = true }
        if let n = unconfirmedStarts { entry.facts.unconfirmedStarts = min(max(n, 0), 1000) }
        if let mb = memoryPeakMB { entry.facts.memoryPeakMB = mb }
        if let mb = memorySteadyMB { entry.facts.memorySteadyMB = mb }
        made[key] = entry
        send(key, inference: latency(unitModel))
        save()
    }

    /// Report again: the installed release was reverted (`to`: the unit version now installed,
    /// or nil). The revert's report carries the calls recorded since the last report (they ran on
    /// it); its later reports none: the calls after the switch go with the release it went back to.
    func reverted(unit: String, model: String, to: String?) {
        let unitModel = "\(unit)/\(model)"
        guard enabled, let key = installedKeys.removeValue(forKey: unitModel), var entry = made[key] else { return }
        entry.facts.reverted = true
        made[key] = entry
        send(key, inference: latency(unitModel))
        made[key]?.refused = true
        firstPending[unitModel] = nil
        if let to, let back = made[Reporter.key(unit, model, to)], !back.refused {
            installedKeys[unitModel] = Reporter.key(unit, model, to)
        }
        save()
    }

    /// A new rollout period (docs/protocol.md §11): `unitVersion` is the release the manifest of
    /// `sequence` gives this device, before the client's own refusals. When this device made a
    /// report of it at a lower sequence, and that release is installed or was refused here, the
    /// report goes again with the new sequence and arm; a refused one with no latency.
    @discardableResult
    func period(unit: String, model: String, unitVersion: String, arm: String, sequence: Int64, reportURL: String?) -> Bool {
        let unitModel = "\(unit)/\(model)", key = Reporter.key(unit, model, unitVersion)
        guard enabled, let url = resolve(reportURL), var entry = made[key] else { return false }
        // Neither installed nor refused (a download deferred, an install under way): the
        // install sends its own report.
        guard installedKeys[unitModel] == key || entry.refused, entry.facts.sequence < sequence else { return false }
        entry.facts.sequence = sequence
        entry.facts.arm = arm
        entry.url = url.absoluteString
        made[key] = entry
        send(key, inference: entry.refused ? nil : latency(unitModel))
        save()
        return true
    }

    func recordInference(unit: String, model: String, ms: Double) {
        guard enabled, ms.isFinite, ms >= 0 else { return }
        let key = "\(unit)/\(model)"
        if firstSeen.insert(key).inserted { firstPending[key] = min(ms, 3_600_000) }
        samples[key, default: []].append(min(ms, 3_600_000))
    }

    /// The app's measured memory for the model, MiB: the install's report goes again at once.
    /// A figure outside 0 to 1048576 (or not finite) is dropped, never sent; the client never guesses.
    func recordMemory(unit: String, model: String, peakMB: Double?, steadyMB: Double?) {
        func usable(_ mb: Double?) -> Double? { mb.flatMap { $0.isFinite && $0 >= 0 && $0 <= Fields.maxMemoryMB ? $0 : nil } }
        let peak = usable(peakMB), steady = usable(steadyMB)
        guard peak != nil || steady != nil else { return }
        changed(unit: unit, model: model, memoryPeakMB: peak, memorySteadyMB: steady)
    }

    /// The calls recorded since the last report of a unit's model (forgotten once taken):
    /// `count`, `p50_ms`, `p90_ms`, `p99_ms` (nearest rank), or nil without any.
    func latency(_ unitModel: String) -> JSONValue? {
        guard let values = samples.removeValue(forKey: unitModel), !values.isEmpty else { return nil }
        let sorted = values.sorted()
        func pct(_ p: Double) -> Double { sorted[max(0, min(sorted.count - 1, Int((p * Double(sorted.count)).rounded(.up)) - 1))] }
        return .object(JSONObject([
            ("count", .int(sorted.count)), ("p50_ms", .double(pct(0.5))), ("p90_ms", .double(pct(0.9))),
            ("p99_ms", .double(pct(0.99))),
        ]))
    }

    func body(_ f: ReportFacts, inference: JSONValue?) -> Data {
        var o = JSONObject()
        // Version 2 keys only when set: a report that uses none stays a version 1 report.
        var version2 = false
        func v2(_ key: String, _ value: JSONValue?) {
            guard let value else { return }
            o[key] = value
            version2 = true
        }
        v2("unconfirmed_starts", f.unconfirmedStarts.map { .int($0) })
        v2("cpu_class", CPUFeatures.cpuClass(device.cpuFeatures).map { .string($0) })
        v2("memory_peak_mb", f.memoryPeakMB.map { .double($0) })
        v2("memory_steady_mb", f.memorySteadyMB.map { .double($0) })
        v2("first_inference_ms", f.firstInferenceMs.map { .double($0) })
        // Version 3 once the install has counted an app metric.
        if let metrics = f.metrics { o["metrics"] = .object(JSONObject(metrics.keys.sorted().map { ($0, metrics[$0]!.json) })) }
        o["schema_version"] = .int(f.metrics != nil ? 3 : version2 ? 2 : 1)
        o["token"] = .string(f.token)
        o["unit"] = .string(f.unit)
        o["model"] = .string(f.model)
        o["version"] = .string(f.version)
        o["unit_version"] = .string(f.unitVersion)
        o["variant"] = .string(f.variant)
        o["tier"] = .string(f.tier)
        o["arm"] = .string(f.arm)
        o["sequence"] = .int(f.sequence)
        o["probe"] = .string(f.probe)
        if let b = f.backend { o["backend"] = .string(b) }
        o["backends_skipped"] = .array(f.backendsSkipped.prefix(8).map { .string($0) })
        if let l = f.loadMs { o["load_ms"] = .double(min(max(l, 0), 3_600_000)) }
        o["load_failed"] = .bool(f.loadFailed)
        o["confirmed"] = .bool(f.confirmed)
        o["reverted"] = .bool(f.reverted)
        if let inference { o["inference"] = inference }
        // A device fact the report's pattern refuses is sent as null, never a reason to skip it.
        if let r = device.mnnRuntime, Version(r) != nil { o["mnn_runtime"] = .string(r) }
        if let os = device.os, os == "android" || os == "ios" { o["os"] = .string(os) }
        // The OS version: the short text, or any version of §7's grammar (one grammar); else null.
        if let v = device.osVersion, Reporter.isShortText(v) || Version(v) != nil { o["os_version"] = .string(v) }
        if let c = deviceClass, Reporter.isShortText(c) { o["device_class"] = .string(c) }
        return CanonicalJSON.encode(.object(o))
    }

    /// `^[A-Za-z0-9._ -]{1,32}$`
    static func isShortText(_ s: String) -> Bool {
        let b = Array(s.utf8)
        return (1...32).contains(b.count) && b.allSatisfy { Fields.isAlnum($0) || $0 == 46 || $0 == 95 || $0 == 32 || $0 == 45 }
    }

    /// Hand the report kept under `key` to the sender, as it is now. A newer report of the same
    /// (token, model) replaces one still waiting for delivery.
    func send(_ key: String, inference: JSONValue?) {
        guard var entry = made[key], let url = URL(string: entry.url) else { return }
        let unitModel = "\(entry.facts.unit)/\(entry.facts.model)"
        if !entry.refused, entry.facts.firstInferenceMs == nil, let first = firstPending.removeValue(forKey: unitModel) {
            entry.facts.firstInferenceMs = first
        }
        if !entry.refused, let counts {
            // The install's app metrics so far; a refused release's report keeps those it had.
            if let totals = counts.totals(entry.facts.token) { entry.facts.metrics = totals }
            counts.reported(entry.facts.token)
        }
        entry.madeAt = clock.now
        serial += 1
        entry.made = serial
        made[key] = entry
        let data = body(entry.facts, inference: inference)
        guard data.count <= ReportSchema.maxBytes else { return }
        let identity = "\(entry.facts.token)/\(entry.facts.model)"
        newest[identity] = serial
        undelivered.removeAll { $0.identity == identity }
        start(Pending(body: data, url: url, identity: identity, serial: serial, tries: 0))
    }

    static func identity(_ body: Data) -> String {
        guard let o = try? StrictJSON.parse(body) else { return "" }
        return "\(o["token"]?.stringValue ?? "")/\(o["model"]?.stringValue ?? "")"
    }

    /// Queue one try. One at a time, in the order made: the receiver merges an install's
    /// reports (docs/protocol.md §12), but an unconfirmed start's report must still never
    /// overtake the revert that follows it.
    func start(_ pending: Pending, retry: Bool = false) {
        inFlight.insert(pending.serial)
        started += 1
        let previous = tail
        let transport = self.transport
        // The task holds the reporter until the try is over: a client dropped right after an
        // update still delivers that update's reports.
        tail = Task {
            await previous?.value
            guard self.due(pending, retry: retry) else { return }
            let status: Int
            do {
                status = try await transport.post(pending.url, body: pending.body, contentType: "application/json", timeout: Reporter.timeout)
            } catch {
                status = 0  // no answer: no connection, or a timeout
            }
            self.finished(pending, status: status)
        }
    }

    /// Whether a queued try still goes: a retry not when a newer report replaced it while it waited.
    func due(_ pending: Pending, retry: Bool) -> Bool {
        if !retry || undelivered.contains(where: { $0.serial == pending.serial }) { return true }
        inFlight.remove(pending.serial)
        return false
    }

    func finished(_ pending: Pending, status: Int) {
        inFlight.remove(pending.serial)
        let index = undelivered.firstIndex { $0.serial == pending.serial }
        if (200..<300).contains(status) {
            delivered += 1
            if let index {
                undelivered.remove(at: index)
                save()
            }
            return
        }
        let answered = status != 0
        let again = !answered || status == 408 || status == 429 || status >= 500
        var kept = pending
        if let index { kept.tries = undelivered[index].tries }
        if answered && again { kept.tries += 1 }
        let replaced = (newest[pending.identity] ?? 0) > pending.serial
        if !again || kept.tries >= Reporter.answeredTries || replaced {
            // A refusal (any other 4xx) is refused again; so many errors: the receiver is not coming back.
            if let index {
                undelivered.remove(at: index)
                save()
            }
            return
        }
        if let index {
            undelivered[index] = kept
        } else {
            undelivered.append(kept)
            if undelivered.count > Reporter.keptUndelivered { undelivered.removeFirst(undelivered.count - Reporter.keptUndelivered) }
        }
        save()
    }

    /// Send again, in order, every report not delivered yet (at each update check).
    func retryPending() {
        for pending in undelivered where !inFlight.contains(pending.serial) { start(pending, retry: true) }
    }

    /// An install's counts go again with its reports when they changed and its last report is this old.
    static let metricsResend: Int64 = 12 * 3600

    /// Whether the install of `token` has counts its last report lacks, and that report was made
    /// 12 hours ago or more (docs/protocol.md §11): at most twice a day.
    func metricsDue(token: String) -> Bool {
        guard enabled, let counts, counts.changed(token) else { return false }
        let last = made.values.filter { !$0.refused && $0.facts.token == token }.map { $0.madeAt ?? 0 }.max()
        guard let last else { return false }
        return clock.now - last >= Reporter.metricsResend
    }

    /// Send the reports not delivered yet and wait for every report in flight; the number
    /// delivered since the last flush.
    func flush() async -> Int {
        counts?.awaitSaved()
        retryPending()
        while true {
            let count = started
            await tail?.value
            if count == started { break }
        }
        defer { delivered = 0 }
        return delivered
    }
}
