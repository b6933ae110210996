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
}

/// Sends reports in the background; never a reason to fail, delay or retry an update.
actor Reporter {
    static let timeout = 5.0

    let enabled: Bool
    let transport: any Transport
    let registry: URL
    let device: DeviceFacts
    let deviceClass: String?
    /// The latest facts per unit/model and where they go, kept in the cache directory so a
    /// confirmation after an app restart is reported under the install's token.
    let store: URL?
    var latest: [String: (facts: ReportFacts, url: URL)] = [:]
    var samples: [String: [Double]] = [:]
    /// The first call recorded per unit/model since its install (or since this process
    /// started), until a report carries it as the install's `first_inference_ms`.
    var firstPending: [String: Double] = [:]
    var firstSeen: Set<String> = []
    var retry: [(body: Data, url: URL)] = []
    var inFlight: [Task<Bool, Never>] = []

    init(enabled: Bool, transport: any Transport, registry: URL, device: DeviceFacts, deviceClass: String?, store: URL? = nil) {
        self.store = store
        if enabled, let store, let data = try? Data(contentsOf: store),
            let saved = try? JSONDecoder().decode(Store.self, from: data)
        {
            latest = saved.latest.compactMapValues { s in URL(string: s.url).map { (s.facts, $0) } }
            retry = saved.retry.compactMap { r in URL(string: r.url).map { (r.body, $0) } }
        }
        self.enabled = enabled
        self.transport = transport
        self.registry = registry
        self.device = device
        self.deviceClass = deviceClass
    }

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

    struct Saved: Codable {
        var facts: ReportFacts
        var url: String
    }

    struct Retry: Codable {
        var body: Data
        var url: String
    }

    /// reports.json: the latest facts per unit/model, and the reports kept for one more try
    /// (an app restart does not lose them).
    struct Store: Codable {
        var latest: [String: Saved]
        var retry: [Retry]
    }

    func save() {
        guard let store else { return }
        let saved = Store(latest: latest.mapValues { Saved(facts: $0.facts, url: $0.url.absoluteString) },
                          retry: retry.map { Retry(body: $0.body, url: $0.url.absoluteString) })
        if let data = try? JSONEncoder().encode(saved) { try? Files.atomicWrite(data, to: store) }
    }

    func installed(_ facts: ReportFacts, reportURL: String?) {
        guard enabled, let url = resolve(reportURL) else { return }
        if facts.probe != "failed" {
            // A new install: its first inference is the next one recorded.
            firstSeen.remove("\(facts.unit)/\(facts.model)")
            firstPending["\(facts.unit)/\(facts.model)"] = nil
        }
        latest["\(facts.unit)/\(facts.model)"] = (facts, url)
        save()
        send(facts, url)
    }

    /// Report the install again with what changed; kept in its later reports.
    func changed(unit: String, model: String, confirmed: Bool = false, reverted: Bool = false,
                 unconfirmedStarts: Int? = nil, memoryPeakMB: Double? = nil, memorySteadyMB: Double? = nil) {
        let key = "\(unit)/\(model)"
        guard enabled, var entry = latest[key] else { return }
        if confirmed { entry.facts.confirmed = true }
        if reverted { entry.facts.reverted = true }
        if let n = unconfirmedStarts { entry.facts.unconfirmedStarts = min(max(n, 0), 1000) }
        if let mb = memoryPeakMB { entry.facts.memoryPeakMB = mb }
        if let mb = memorySteadyMB { entry.facts.memorySteadyMB = mb }
        if entry.facts.firstInferenceMs == nil, let first = firstPending.removeValue(forKey: key) {
            entry.facts.firstInferenceMs = first
        }
        latest[key] = entry
        save()
        send(entry.facts, entry.url)
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

    func body(_ f: ReportFacts) -> Data {
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
        o["schema_version"] = .int(version2 ? 2 : 1)
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
        let key = "\(f.unit)/\(f.model)"
        if let values = samples[key], !values.isEmpty {
            let sorted = values.sorted()
            func pct(_ p: Double) -> Double { sorted[min(sorted.count - 1, Int((p * Double(sorted.count)).rounded(.up)) - 1 < 0 ? 0 : Int((p * Double(sorted.count)).rounded(.up)) - 1)] }
            o["inference"] = .object(JSONObject([
                ("count", .int(sorted.count)), ("p50_ms", .double(pct(0.5))), ("p90_ms", .double(pct(0.9))),
                ("p99_ms", .double(pct(0.99))),
            ]))
            samples[key] = []
        }
        if let r = device.mnnRuntime, Fields.isDottedVersion(r) { o["mnn_runtime"] = .string(r) }
        if let os = device.os, os == "android" || os == "ios" { o["os"] = .string(os) }
        if let v = device.osVersion, Reporter.isShortText(v) { o["os_version"] = .string(v) }
        if let c = deviceClass, Reporter.isShortText(c) { o["device_class"] = .string(c) }
        return CanonicalJSON.encode(.object(o))
    }

    /// `^[A-Za-z0-9._ -]{1,32}$`
    static func isShortText(_ s: String) -> Bool {
        let b = Array(s.utf8)
        return (1...32).contains(b.count) && b.allSatisfy { Fields.isAlnum($0) || $0 == 46 || $0 == 95 || $0 == 32 || $0 == 45 }
    }

    func send(_ facts: ReportFacts, _ url: URL) {
        let data = body(facts)
        guard data.count <= 4096 else { return }
        startSend(data, url, retryOnFailure: true)
    }

    func startSend(_ data: Data, _ url: URL, retryOnFailure: Bool) {
        let transport = self.transport
        // One at a time, in the order made: the receiver keeps the report that arrives last
        // per install (docs/protocol.md §12), so an unconfirmed start's report must never
        // overtake the revert that follows it.
        let previous = inFlight.last
        let task = Task<Bool, Never> { [weak self] in
            _ = await previous?.value
            let status: Int
            do {
                status = try await transport.post(url, body: data, contentType: "application/json", timeout: Reporter.timeout)
            } catch {
                status = 0
            }
            if (200..<300).contains(status) { return true }
            // Kept for one more try at the next update: a network error, 408, 429 or 5xx.
            if retryOnFailure, status == 0 || status == 408 || status == 429 || status >= 500 {
                await self?.keep(data, url)
            }
            return false
        }
        inFlight.append(task)
    }

    func keep(_ data: Data, _ url: URL) {
        retry.append((data, url))
        save()
    }

    /// One more try for reports that failed before; then they are dropped.
    func retryPending() {
        let again = retry
        retry = []
        if !again.isEmpty { save() }
        for (data, url) in again { startSend(data, url, retryOnFailure: false) }
    }

    /// Wait for every report in flight (and retry the kept ones once); the number delivered.
    func flush() async -> Int {
        retryPending()
        var sent = 0
        while !inFlight.isEmpty {
            let tasks = inFlight
            inFlight = []
            for task in tasks where await task.value { sent += 1 }
        }
        return sent
    }
}
