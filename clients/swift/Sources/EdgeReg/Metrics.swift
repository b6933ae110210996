import Foundation

/// A call of `record` or `observe` the installed release cannot take: a programming error at the
/// call site (docs/protocol.md §11, "App metrics"). Nothing was counted.
public struct MetricError: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Problem: String, Sendable {
        /// The installed release declares no metric of that name.
        case undeclared
        /// The metric is of the other kind (`record` on a distribution, `observe` on a rate).
        case otherKind = "other-kind"
        /// The value is NaN or infinite.
        case notFinite = "not-finite"
    }

    public let problem: Problem
    public let message: String
    public var description: String { message }
}

extension EdgeRegClient {
    /// Count one event of the app metric `metric` of `unit`, a `rate`: whether it succeeded
    /// (docs/protocol.md §3, "App metrics"). The count goes with the installed release: kept
    /// across app restarts, never reset within its install, and sent as totals with its reports
    /// (only counts, never a value). From any thread or task, without `await`: it never waits
    /// for the disk or the network (the counts are written moments later in the background).
    ///
    /// - Returns: true when counted; false when nothing is installed (nothing is counted then) or
    ///   reporting is off.
    /// - Throws: `MetricError` when the installed release declares no rate of that name (declare
    ///   it in models.toml, or call `observe` for a distribution).
    @discardableResult
    public nonisolated func record(_ unit: ReleaseUnit, _ metric: String, success: Bool) throws(MetricError) -> Bool {
        try count(unit, metric, kind: .rate, value: success ? 1 : 0, call: "record")
    }

    /// Count one value of the app metric `metric` of `unit`, a `distribution`, in its bucket (a
    /// value equal to an edge falls in the bucket that edge closes). As `record`: the installed
    /// release's, from anywhere, never waiting; the value itself never leaves the device.
    ///
    /// - Returns: true when counted; false when nothing is installed (nothing is counted then) or
    ///   reporting is off.
    /// - Throws: `MetricError` when `value` is not finite, or the installed release declares no
    ///   distribution of that name.
    @discardableResult
    public nonisolated func observe(_ unit: ReleaseUnit, _ metric: String, _ value: Double) throws(MetricError) -> Bool {
        guard AppMetric.refusal([:], metric, kind: .distribution, value: value) != .notFinite else {
            throw MetricError(problem: .notFinite, message: "observe(\"\(metric)\", \(value)): the value must be a finite number")
        }
        return try count(unit, metric, kind: .distribution, value: value, call: "observe")
    }

    /// The app metrics the installed release of `unit` declares, by name (empty: none, or nothing
    /// installed). Reads the install record once per install.
    public nonisolated func metrics(_ unit: ReleaseUnit) -> [String: AppMetric] {
        declaredMetrics.lookup(unit, layout)?.metrics ?? [:]
    }

    private nonisolated func count(_ unit: ReleaseUnit, _ metric: String, kind: AppMetric.Kind, value: Double, call: String) throws(MetricError) -> Bool {
        // Nothing installed (or a cache beyond reading): nothing counted, never an error.
        guard let installed = declaredMetrics.lookup(unit, layout) else { return false }
        let why = AppMetric.refusal(installed.metrics, metric, kind: kind, value: value)
        guard why != .undeclared, let declared = installed.metrics[metric] else {
            let names = installed.metrics.keys.sorted().joined(separator: ", ")
            throw MetricError(problem: .undeclared, message: "\(call)(\"\(metric)\"): \(unit.name) \(installed.version) declares no app metric '\(metric)' (declared: \(names.isEmpty ? "none" : names)); declare it in models.toml [\(unit.isBundle ? "bundles" : "models").\(unit.name).metrics.\(metric)]")
        }
        guard why != .otherKind else {
            throw MetricError(problem: .otherKind, message: "\(call)(\"\(metric)\"): app metric '\(metric)' of \(unit.name) \(installed.version) is a \(declared.kind.rawValue): use \(declared.kind == .rate ? "record" : "observe")()")
        }
        guard let counts = metricCounts, let token = installed.token else { return false }
        counts.count(token: token, metric: declared, value: kind == .rate ? Int(value) : declared.bucket(for: value))
        return true
    }
}

/// What the installed release of each unit declares, read from installed.json once per write of
/// it by this client (`invalidate`), so counting from any thread never waits on the actor.
final class DeclaredMetrics: @unchecked Sendable {
    struct Installed: Sendable {
        let version: String
        let token: String?
        let metrics: [String: AppMetric]
    }

    private let lock = NSLock()
    private var generation = 0
    private var byUnit: [ReleaseUnit: Installed?] = [:]

    /// The installed release of `unit`, or nil when nothing is installed (or it cannot be read).
    func lookup(_ unit: ReleaseUnit, _ layout: CacheLayout) -> Installed? {
        let (cached, seen) = lock.withLock { (byUnit[unit], generation) }
        if let cached { return cached }
        var found: Installed?
        if let all = try? Files.readJSON(layout.installedFile), let value = all[unit.isBundle ? "bundles" : "models"]?[unit.name],
            let set = InstalledSet(json: value)
        {
            found = Installed(version: set.version, token: set.token, metrics: set.metrics ?? [:])
        }
        lock.withLock {
            // A write since the read made it stale: read again next time.
            if generation == seen { byUnit[unit] = .some(found) }
        }
        return found
    }

    /// installed.json was written: every unit is read again.
    func invalidate() {
        lock.withLock {
            generation += 1
            byUnit = [:]
        }
    }
}

/// One app metric's totals in a report (docs/protocol.md §12, `metrics`).
enum MetricTotal: Sendable, Equatable, Codable {
    case rate(events: Int64, successes: Int64)
    case distribution(counts: [Int64])

    var json: JSONValue {
        switch self {
        case .rate(let events, let successes):
            return .object(JSONObject([("events", .int(events)), ("successes", .int(successes))]))
        case .distribution(let counts):
            return .object(JSONObject([("counts", .array(counts.map { .int($0) }))]))
        }
    }
}

/// The app metrics counted per install (docs/protocol.md §11), by the install's report token: a
/// rate's events and successes, a distribution's count per bucket, since the install and never
/// reset within it, and whether they changed since the install's last report (the 12-hour
/// resend). Kept in metrics.json in the cache, next to the reporter's reports.json.
///
/// Counting never touches the disk on the caller's thread: a count marks the file due and one
/// serial queue per process writes it (atomically) moments later. Every read and write of every
/// client's file goes through that queue, so a client created again on the same cache in one
/// process reads what the one before it wrote.
final class MetricCounts: @unchecked Sendable {
    /// Installs whose counts are kept at most (the least recently used go first).
    static let kept = 16
    static let io = DispatchQueue(label: "dev.edgereg.metrics")

    struct Tally: Codable {
        var totals: [String: MetricTotal] = [:]
        var changed = false
    }

    struct Saved: Codable {
        var installs: [String: Tally]
        /// Tokens, least recently used first.
        var order: [String]
    }

    private let lock = NSLock()
    private let file: URL
    private var tallies: [String: Tally] = [:]
    private var order: [String] = []
    private var saveQueued = false

    init(file: URL) {
        self.file = file
        // Behind any write still queued by a client before this one.
        let data = MetricCounts.io.sync { try? Data(contentsOf: file) }
        if let data, let saved = try? JSONDecoder().decode(Saved.self, from: data) {
            tallies = saved.installs
            order = saved.order.filter { saved.installs[$0] != nil }
            for token in saved.installs.keys where !order.contains(token) { order.append(token) }
        }
    }

    /// Count one outcome for the install of `token`: a rate's event (`value` 1: it succeeded), or
    /// a distribution's value in bucket `value`. Counts stop at 10^9 (the most a report carries).
    func count(token: String, metric: AppMetric, value: Int) {
        lock.withLock {
            order.removeAll { $0 == token }
            order.append(token)
            while order.count > MetricCounts.kept { tallies[order.removeFirst()] = nil }
            var tally = tallies[token] ?? Tally()
            let cap = ReportSchema.maxCount
            switch (metric.kind, tally.totals[metric.name]) {
            case (.rate, .rate(let events, let successes)?):
                // At 10^9 events an event counts no more, its success neither: the share stays.
                guard events < cap else { return }
                tally.totals[metric.name] = .rate(events: events + 1, successes: min(events + 1, successes + Int64(value)))
            case (.rate, _):
                tally.totals[metric.name] = .rate(events: 1, successes: Int64(value))
            case (.distribution, let old):
                var counts = [Int64](repeating: 0, count: metric.buckets.count + 1)
                if case .distribution(let before)? = old, before.count == counts.count { counts = before }
                counts[value] = min(cap, counts[value] + 1)
                tally.totals[metric.name] = .distribution(counts: counts)
            }
            tally.changed = true
            tallies[token] = tally
            scheduleSave()
        }
    }

    /// The install's totals as a report carries them, or nil before any count.
    func totals(_ token: String) -> [String: MetricTotal]? {
        lock.withLock { tallies[token].flatMap { $0.totals.isEmpty ? nil : $0.totals } }
    }

    /// A report of the install was made, carrying its totals.
    func reported(_ token: String) {
        lock.withLock {
            guard tallies[token]?.changed == true else { return }
            tallies[token]?.changed = false
            scheduleSave()
        }
    }

    /// The install's counts changed since its last report.
    func changed(_ token: String) -> Bool { lock.withLock { tallies[token]?.changed == true } }

    /// Called locked: one write queued at a time, of the counts as they are when it runs.
    private func scheduleSave() {
        guard !saveQueued else { return }
        saveQueued = true
        MetricCounts.io.async { self.save() }
    }

    private func save() {
        let data = lock.withLock { () -> Data? in
            saveQueued = false
            return try? JSONEncoder().encode(Saved(installs: tallies, order: order))
        }
        // Best effort: kept in memory, the next count writes again.
        if let data { try? Files.atomicWrite(data, to: file) }
    }

    /// Wait until the counts made so far are on disk.
    func awaitSaved() { MetricCounts.io.sync {} }
}

/// The client's clock (seconds since 1970): the real one, or a fixed one a test sets; read by
/// the client and its reporter alike.
final class ClientClock: @unchecked Sendable {
    private let lock = NSLock()
    private var fixed: Int64?

    func set(_ now: Int64?) { lock.withLock { fixed = now } }
    var now: Int64 { lock.withLock { fixed } ?? WireTime.now() }
}

extension AppMetric {
    /// Why a call is a programming error of the app (docs/protocol.md §11), or nil, in this
    /// order: a distribution's value that is not finite, a name the installed release does not
    /// declare (names compare exactly), a metric of the other kind.
    static func refusal(_ declared: [String: AppMetric], _ name: String, kind: Kind, value: Double) -> MetricError.Problem? {
        if kind == .distribution, !value.isFinite { return .notFinite }
        guard let metric = declared[name] else { return .undeclared }
        return metric.kind == kind ? nil : .otherKind
    }
}
