import Foundation

/// Everything a client is created with.
public struct ClientConfiguration: Sendable {
    /// The registry root (a directory URL; a trailing slash is added when missing).
    public var registry: URL
    public var trustedKeys: TrustedKeys
    public var cacheDirectory: URL
    public var device: DeviceFacts
    /// The device's tier, when the app knows it; else resolved from `tiers`.
    public var tier: String?
    /// Tier rules, best first (the last one a catch-all).
    public var tiers: [(String, TierRules)]
    public var runner: (any ModelRunner)?
    /// Run the golden probe on each hinted backend before every switch (§11).
    public var selfTest: Bool
    public var policy: DownloadPolicy
    public var limits: Limits
    public var reporting: Bool
    public var deviceClass: String?
    public var maxUnconfirmedStarts: Int
    /// Releases shipped in the app, by unit name.
    public var bundled: [String: BundledRelease]
    /// How the client speaks HTTP (`ClientTransport`): nil, URLSession; an app's own stack, or
    /// a test's (the fleet simulator's socket transport, bound to one address per device).
    public var transport: (any ClientTransport)?

    /// Why a client cannot be built from this configuration (the self-test on and no runner), or
    /// nil. `EdgeRegClient(_:)` stops with a precondition failure naming it.
    public var problem: String? {
        if selfTest, runner == nil {
            return "the self-test is on and there is no model runner: give runner: MNNRunner(...) (docs/guides/ios.md), "
                + "or selfTest: false to install without checking the golden probe (docs/protocol.md §11)"
        }
        return nil
    }

    public init(registry: URL, trustedKeys: TrustedKeys, cacheDirectory: URL, device: DeviceFacts, tier: String? = nil,
                tiers: [(String, TierRules)] = [], runner: (any ModelRunner)? = nil, selfTest: Bool = false,
                policy: DownloadPolicy = DownloadPolicy(), limits: Limits = Limits(), reporting: Bool = true,
                deviceClass: String? = nil, maxUnconfirmedStarts: Int = 3, bundled: [String: BundledRelease] = [:],
                transport: (any ClientTransport)? = nil) {
        self.transport = transport
        self.registry = registry
        self.trustedKeys = trustedKeys
        self.cacheDirectory = cacheDirectory
        self.device = device
        self.tier = tier
        self.tiers = tiers
        self.runner = runner
        self.selfTest = selfTest
        self.policy = policy
        self.limits = limits
        self.reporting = reporting
        self.deviceClass = deviceClass
        self.maxUnconfirmedStarts = maxUnconfirmedStarts
        self.bundled = bundled
    }
}

/// An outcome of a step: a reason code and a message (never thrown across the public API).
struct Failure: Error {
    let code: String
    let message: String
    /// A self-test rejection marks the release bad on this device.
    var permanent = false
}

extension Rejection { var failure: Failure { Failure(code: reason, message: message) } }
extension CacheError { var failure: Failure { Failure(code: code, message: message) } }
extension TransportError {
    /// A connection the app's cancel cut (a manifest's, a blob's) is the cancel, not the network's
    /// failure: `cancelled`, never `transport` (which the app would retry as one).
    var failure: Failure {
        if Task.isCancelled { return EdgeRegClient.cancelledFailure }
        return Failure(code: status == 404 ? Reason.notFound : Reason.transport, message: message)
    }
}

/// The edgereg client: fetch, verify, choose, download, self-test and install signed models
/// (docs/protocol.md §7–§11). Every method returns a value; no client outcome is thrown.
public actor EdgeRegClient {
    public nonisolated let configuration: ClientConfiguration
    /// The tier this device is in, and why (nil when no tier rule matched).
    public nonisolated let tier: String?
    public nonisolated let tierReason: String
    let layout: CacheLayout
    let transport: any Transport
    let clock = ClientClock()
    /// The app metrics counted per install (nil: reporting off).
    let metricCounts: MetricCounts?
    let declaredMetrics = DeclaredMetrics()
    /// When the update under way must be over: the whole fetch is bounded, not only each read.
    var deadline = Date.distantFuture
    let reporter: Reporter

    public init(_ configuration: ClientConfiguration) {
        if let problem = configuration.problem {
            // A programming error at the call site, as a bad URL literal: an app that cannot run the
            // probe would mark every good release bad and report failures that halt every canary.
            preconditionFailure("EdgeRegClient: \(problem)")
        }
        var config = configuration
        if !config.registry.absoluteString.hasSuffix("/") {
            config.registry = URL(string: config.registry.absoluteString + "/") ?? config.registry
        }
        self.configuration = config
        let resolved: (String?, String)
        if let problem = config.device.problem {
            resolved = (nil, "the device facts are not usable: \(problem)")
        } else if let tier = config.tier {
            resolved = (tier, "tier \(tier): given by the app")
        } else if let found = Tiers.resolve(config.tiers, config.device) {
            resolved = (found.tier, found.reason)
        } else {
            resolved = (nil, "the device matches none of the tiers \(config.tiers.map(\.0).joined(separator: ", "))")
        }
        tier = resolved.0
        tierReason = resolved.1
        let layout = CacheLayout(root: config.cacheDirectory)
        self.layout = layout
        let transport: any Transport = config.transport.map { AppTransport($0, limits: config.limits) }
            ?? HTTPTransport(limits: config.limits)
        self.transport = transport
        let counts = config.reporting ? MetricCounts(file: layout.root.appendingPathComponent("metrics.json")) : nil
        metricCounts = counts
        reporter = Reporter(enabled: config.reporting, transport: transport, registry: config.registry, device: config.device,
                            deviceClass: config.deviceClass, store: layout.root.appendingPathComponent("reports.json"),
                            counts: counts, clock: clock)
    }

    /// Use a fixed clock (seconds since 1970), or the real one with nil.
    public func setClock(_ now: Int64?) { clock.set(now) }

    var now: Int64 { clock.now }

    // MARK: public API

    // One operation at a time: an actor may run another call while one awaits the
    // network, and an install must not interleave with a revert of the same cache.
    private var busy = false
    private var waiting: [CheckedContinuation<Void, Never>] = []

    func exclusive<T: Sendable>(_ body: () async -> T) async -> T {
        if busy {
            await withCheckedContinuation { waiting.append($0) }
        } else {
            busy = true
        }
        let result = await body()
        if waiting.isEmpty {
            busy = false
        } else {
            waiting.removeFirst().resume()  // handed over: still busy
        }
        return result
    }

    /// Check for an update and install it; on any failure keep the last known good.
    ///
    /// `conditions`: what the platform says now; a condition the policy requires and nobody
    /// said is unmet, so the update waits (`deferred`). Cancelling the calling task stops the
    /// update within a second: `cancelled`, nothing installed, the download kept for a resume.
    /// `progress` is told (bytes done, bytes total) of the release, the total before the first
    /// byte, on the transport's queue.
    public func update(_ unit: ReleaseUnit, conditions: Conditions = Conditions(),
                       progress: (@Sendable (Int64, Int64) -> Void)? = nil) async -> UpdateResult {
        await exclusive {
            self.progress = progress
            defer { self.progress = nil }
            return await self.updateNow(unit, conditions: conditions)
        }
    }

    /// Whether an update would install a release, which, and how many bytes it would download,
    /// without downloading a blob (the manifest is fetched and verified).
    public func check(_ unit: ReleaseUnit, conditions: Conditions = Conditions()) async -> UpdateCheck {
        await exclusive { await self.checkNow(unit, conditions: conditions) }
    }

    /// Delete the unit from the device: its install, its last good set and their files. The
    /// rollback protection and the releases refused here stay. False when nothing was installed.
    @discardableResult
    public func delete(_ unit: ReleaseUnit) async -> Bool {
        await exclusive { self.deleteNow(unit) }
    }

    /// Every model and bundle installed in this client's cache.
    public func installedUnits() -> [InstalledUnit] {
        installedUnitNames().compactMap { unit -> InstalledUnit? in
            guard let set = try? readInstalled(unit) else { return nil }
            return InstalledUnit(unit: unit, version: set.version, isCandidate: set.isCandidate)
        }.sorted { ($0.unit.name, $0.unit.isBundle ? 1 : 0) < ($1.unit.name, $1.unit.isBundle ? 1 : 0) }
    }

    /// Call `listener` after each change of what is installed, before the call that made it returns.
    public func addListener(_ listener: @escaping @Sendable (ModelChange) -> Void) {
        listeners.append(listener)
    }

    /// The changes of what is installed, as they happen (installed, rolled back by the server,
    /// reverted, deleted): a new sequence for each caller, ended when its task is cancelled.
    public func changes() -> AsyncStream<ModelChange> {
        let (stream, continuation) = AsyncStream<ModelChange>.makeStream(bufferingPolicy: .bufferingNewest(64))
        listeners.append { continuation.yield($0) }
        return stream
    }

    var listeners: [@Sendable (ModelChange) -> Void] = []
    var progress: (@Sendable (Int64, Int64) -> Void)?
    var tally: ProgressTally?

    func announce(_ change: ModelChange) {
        for listener in listeners { listener(change) }
    }

    /// Stop here when the app cancelled the update (before anything is switched).
    func checkpoint() throws {
        if Task.isCancelled { throw Self.cancelledFailure }
    }

    static let cancelledFailure = Failure(
        code: Reason.cancelled, message: "the update was cancelled by the app; nothing was installed, the download resumes next time")

    /// What is installed, without network (installs a shipped release on the first launch).
    public func current(_ unit: ReleaseUnit) async -> UpdateResult {
        await exclusive { await self.currentNow(unit) }
    }

    /// Call once at every start of the app, before loading (before or after `update`): counts the
    /// start before it when that start ran the unconfirmed install and ended without a
    /// confirmation, and reverts a crash loop (§11).
    public func appStarted(_ unit: ReleaseUnit) async -> StartOutcome {
        await exclusive { await self.appStartedNow(unit) }
    }

    /// The app's first real inference with the installed release succeeded.
    @discardableResult
    public func confirm(_ unit: ReleaseUnit, version: String? = nil) async -> Bool {
        await exclusive { await self.confirmNow(unit, version: version) }
    }

    /// Switch back to the last good set and mark the current release bad on this device.
    public func revert(_ unit: ReleaseUnit, reason: String) async -> UpdateResult {
        await exclusive { await self.revertNow(unit, reason: reason) }
    }

    /// Check for an update and install it; on any failure keep the last known good.
    func updateNow(_ unit: ReleaseUnit, conditions: Conditions) async -> UpdateResult {
        deadline = Date().addingTimeInterval(configuration.limits.deadline)
        await installShippedIfAny(unit)
        let installed: InstalledSet?
        do {
            installed = try readInstalled(unit)
        } catch {
            recordError(unit, error.failure)
            return result(unit, nil, error: error.failure)
        }
        await reporter.retryPending()
        await sendMetricsIfDue(unit, installed)
        do {
            let r = try await fetch(unit, installed: installed, conditions: conditions)
            recordError(unit, nil)
            return r
        } catch let f as Failure {
            recordError(unit, f)
            return result(unit, installed, error: f)
        } catch {
            let f = Failure(code: Reason.transport, message: "\(error)")
            recordError(unit, f)
            return result(unit, installed, error: f)
        }
    }

    /// What is installed, without network (installs a shipped release on the first launch).
    func currentNow(_ unit: ReleaseUnit) async -> UpdateResult {
        await installShippedIfAny(unit)
        do {
            return result(unit, try readInstalled(unit))
        } catch {
            return result(unit, nil, error: error.failure)
        }
    }

    /// What is installed, pending and failing for a unit; `ready` hashes every blob again.
    public func status(_ unit: ReleaseUnit, verify: Bool = true) -> UnitStatus {
        let record = try? readInstalled(unit)
        func info(_ s: InstalledSet?) -> UnitStatus.SetInfo? {
            guard let s else { return nil }
            return UnitStatus.SetInfo(version: s.version, isCandidate: s.isCandidate, bundled: s.bundled,
                                      members: s.members.mapValues { ($0.entry.version, $0.entry.sha256) })
        }
        let status = (try? Files.readJSON(layout.statusFile(unit.name))) ?? JSONObject()
        var pending: PendingRelease?
        if let p = status["pending"]?.objectValue, let version = p["version"]?.stringValue {
            var total: Int64 = 0, remaining: Int64 = 0
            for blob in p["blobs"]?.arrayValue ?? [] {
                guard let sha = blob["sha256"]?.stringValue, let size = blob["size"]?.intValue else { continue }
                total += size
                if !layout.hasBlob(BlobRef(sha256: sha, size: size)) {
                    remaining += size - min(size, Files.size(layout.part(sha)) ?? 0)
                }
            }
            pending = PendingRelease(version: version, isCandidate: p["is_candidate"]?.boolValue ?? false, totalBytes: total,
                                     remainingBytes: remaining, deferred: p["deferred"]?.stringValue,
                                     since: p["since"]?.stringValue ?? "")
        }
        var lastError: LastError?
        if let e = status["last_error"]?.objectValue, let code = e["code"]?.stringValue {
            lastError = LastError(code: code, message: e["message"]?.stringValue ?? "", at: e["at"]?.stringValue ?? "")
        }
        var ready = record != nil
        if let record {
            for blob in record.blobs {
                guard layout.hasBlob(blob) else {
                    ready = false
                    break
                }
                if verify, hashFile(layout.blob(blob.sha256)) != blob.sha256 {
                    ready = false
                    break
                }
            }
        }
        return UnitStatus(unit: unit, installed: info(record), previous: info(record?.previous.first), pending: pending,
                          lastError: lastError, badReleases: readBad(unit), ready: ready)
    }

    /// Call once at every start of the app, before loading: reverts a crash loop (§11).
    func appStartedNow(_ unit: ReleaseUnit) async -> StartOutcome {
        startedUnits.insert(unit.name)
        var ledger = readHealth()
        var h = ledger[unit.name] ?? UnitHealth()
        let before = h.starts
        let decided = h.onStart(unit: unit.name, maxStarts: configuration.maxUnconfirmedStarts)
        ledger[unit.name] = h
        writeHealth(ledger)
        // A start counted against the unconfirmed install: its report goes again with the
        // count, so a crash loop shows before the revert, whose report follows (§11).
        if let installed = h.installed, !h.confirmed, h.starts > before, let record = try? readInstalled(unit),
            record.version == installed
        {
            for name in record.members.keys.sorted() {
                await reporter.changed(unit: unit.name, model: name, unconfirmedStarts: h.starts)
            }
        }
        guard let revert = decided else {
            return StartOutcome(unit: unit, reverted: false, version: nil, reason: nil)
        }
        let record = try? readInstalled(unit)
        guard let record, record.version == revert.version else {
            // Something else is installed by now: nothing to take back.
            var ledger = readHealth()
            ledger[unit.name, default: UnitHealth()].onReverted(to: record?.version)
            writeHealth(ledger)
            return StartOutcome(unit: unit, reverted: false, version: nil, reason: nil)
        }
        _ = await revertNow(unit, reason: revert.reason)
        return StartOutcome(unit: unit, reverted: true, version: revert.version, reason: revert.reason)
    }

    /// `appStarted` for every unit this cache holds.
    public func appStarted() async -> [StartOutcome] {
        await exclusive { await self.allStarted() }
    }

    func allStarted() async -> [StartOutcome] {
        var out: [StartOutcome] = []
        for unit in installedUnitNames() { out.append(await appStartedNow(unit)) }
        return out
    }

    /// The app's first real inference with the installed release succeeded.
    @discardableResult
    func confirmNow(_ unit: ReleaseUnit, version: String?) async -> Bool {
        var ledger = readHealth()
        var h = ledger[unit.name] ?? UnitHealth()
        let confirmed = h.onConfirm(version)
        guard confirmed else { return false }
        ledger[unit.name] = h
        writeHealth(ledger)
        if let record = try? readInstalled(unit) {
            for name in record.members.keys.sorted() { await reporter.changed(unit: unit.name, model: name, confirmed: true) }
        }
        return true
    }

    /// One real inference's latency, for the next report (`model`: a bundle member).
    public func recordInference(_ unit: ReleaseUnit, ms: Double, model: String? = nil) async {
        await reporter.recordInference(unit: unit.name, model: model ?? unit.name, ms: ms)
    }

    /// The memory the app measured for the installed model, MiB (`model`: a bundle member): the
    /// install's report goes again at once and its later reports keep the figures. The client
    /// never guesses them; nothing is sent when nothing is installed.
    public func recordMemory(_ unit: ReleaseUnit, peakMB: Double?, steadyMB: Double? = nil, model: String? = nil) async {
        await reporter.recordMemory(unit: unit.name, model: model ?? unit.name, peakMB: peakMB, steadyMB: steadyMB)
    }

    /// Switch back to the last good set and mark the current release bad on this device.
    func revertNow(_ unit: ReleaseUnit, reason: String) async -> UpdateResult {
        guard let record = try? readInstalled(unit) else { return result(unit, nil) }
        markBad(unit, record.version, "reverted: \(reason)")
        var previous = record.previous.first
        if let p = previous, !p.blobs.allSatisfy({ layout.hasBlob($0) }) { previous = nil }
        do {
            try writeInstalled(unit, previous)
        } catch {
            return result(unit, record, error: error.failure)
        }
        recordError(unit, Failure(code: Reason.reverted, message: "\(record.version) reverted: \(reason)"))
        evict()
        var ledger = readHealth()
        ledger[unit.name, default: UnitHealth()].onReverted(to: previous?.version)
        writeHealth(ledger)
        for name in record.members.keys.sorted() { await reporter.reverted(unit: unit.name, model: name, to: previous?.version) }
        announce(ModelChange(unit: unit, kind: .reverted, version: previous?.version, previous: record.version))
        return result(unit, previous, updated: true)
    }

    /// Send every pending report now and wait for them; the number sent.
    public func flushReports() async -> Int { await reporter.flush() }

    /// App metrics counted since the install's last report, 12 hours after it: the installed
    /// release's reports go again now (docs/protocol.md §11).
    func sendMetricsIfDue(_ unit: ReleaseUnit, _ installed: InstalledSet?) async {
        guard let installed, let token = installed.token, await reporter.metricsDue(token: token) else { return }
        for name in installed.members.keys.sorted() { await reporter.changed(unit: unit.name, model: name) }
    }

    // MARK: the update

    func fetch(_ unit: ReleaseUnit, installed: InstalledSet?, conditions: Conditions) async throws -> UpdateResult {
        let (chosen, notModified) = try await acceptManifest(unit)
        try checkpoint()
        return try await apply(unit, chosen, installed: installed, conditions: conditions, notModified: notModified, shipped: nil)
    }

    func checkNow(_ unit: ReleaseUnit, conditions: Conditions) async -> UpdateCheck {
        deadline = Date().addingTimeInterval(configuration.limits.deadline)
        let installed = try? readInstalled(unit)
        do {
            let (decision, _) = try await acceptManifest(unit, reportingPeriod: false)
            guard let entry = decision.entry else {
                return UpdateCheck(available: false, version: nil, installed: installed?.version, isCandidate: false, downloadBytes: 0,
                                   deferred: nil, fallback: decision.fallback, errorCode: nil, error: nil)
            }
            let entries = entry.members(unit: unit.name)
            let new = InstalledSet(version: entry.version, tier: tier ?? "", isCandidate: decision.isCandidate,
                                   sequence: decision.manifest.sequence, bundled: false, token: nil, reportURL: nil,
                                   members: entries.mapValues { InstalledSet.Member(entry: $0, backend: nil) })
            let same = installed.map { new.sameRelease($0) } ?? false
            var seen = Set<String>()
            let missing = entries.keys.sorted().flatMap { entries[$0]!.blobs }.filter { seen.insert($0.sha256).inserted && !layout.hasBlob($0) }
            var remaining: Int64 = 0
            for ref in missing { remaining += max(0, ref.size - min(ref.size, Files.size(layout.part(ref.sha256)) ?? 0)) }
            return UpdateCheck(available: !same, version: entry.version, installed: installed?.version, isCandidate: decision.isCandidate,
                               downloadBytes: same ? 0 : remaining,
                               deferred: same || missing.isEmpty ? nil : configuration.policy.unmet(conditions),
                               fallback: decision.fallback, errorCode: nil, error: nil)
        } catch let f as Failure {
            return UpdateCheck(available: false, version: installed?.version, installed: installed?.version, isCandidate: false,
                               downloadBytes: 0, deferred: nil, fallback: nil, errorCode: f.code, error: f.message)
        } catch {
            return UpdateCheck(available: false, version: installed?.version, installed: installed?.version, isCandidate: false,
                               downloadBytes: 0, deferred: nil, fallback: nil, errorCode: Reason.transport, error: "\(error)")
        }
    }

    func deleteNow(_ unit: ReleaseUnit) -> Bool {
        let record = try? readInstalled(unit)
        try? setPending(unit, nil)
        guard let record else { return false }
        do {
            try writeInstalled(unit, nil)
        } catch {
            recordError(unit, error.failure)
            return false
        }
        evict()
        var ledger = readHealth()
        ledger[unit.name, default: UnitHealth()].onReverted(to: nil)
        writeHealth(ledger)
        announce(ModelChange(unit: unit, kind: .deleted, version: nil, previous: record.version))
        return true
    }

    /// Fetch and verify the manifest, store its sequence and bytes; the decision (bad releases
    /// counted as not fitting) and whether the server said 304.
    /// `reportingPeriod`: an update's check, which reports the rollout period (§11); `check` does not.
    func acceptManifest(_ unit: ReleaseUnit, reportingPeriod: Bool = true) async throws -> (Decision, Bool) {
        guard let tier else { throw Failure(code: Reason.notFound, message: tierReason) }
        let tierFile = layout.tierFile(unit.name, tier)
        let state = try catching { () throws(CacheError) in try Files.readJSON(tierFile) }
        let cachedEnvelope = state?["envelope"]?.stringValue.flatMap { Data(base64Encoded: $0) }
        let cachedETag = state?["etag"]?.stringValue
        let highest = try readSequence(unit)
        let (data, etag, notModified) = try await getManifest(unit, tier: tier, cached: cachedEnvelope, etag: cachedETag)
        let bad = readBad(unit)
        var input = Decide.Input(manifest: data, trusted: configuration.trustedKeys, unit: unit.name, tier: tier,
                                 deviceID: configuration.device.deviceID, app: appFacts,
                                 highestSeenSequence: highest, now: now, bundle: unit.isBundle)
        input.badVersions = []
        let decision = try catching { () throws(Rejection) in try Decide.decide(input) }
        // Rollback protection first, before anything is downloaded.
        if decision.sequence != highest {
            try catching { () throws(CacheError) in
                try Files.writeJSON(JSONObject([("sequence", .int(decision.sequence))]), to: layout.sequenceFile(unit.name))
            }
        }
        if cachedEnvelope != data || cachedETag != etag {
            var o = JSONObject()
            o["envelope"] = .string(data.base64EncodedString())
            o["etag"] = etag.map { .string($0) } ?? .null
            o["sequence"] = .int(decision.sequence)
            try catching { () throws(CacheError) in try Files.writeJSON(o, to: tierFile) }
        }
        if reportingPeriod, !notModified { await reportPeriod(unit, decision) }
        return (try avoidBad(unit, decision, bad: bad), notModified)
    }

    /// A new rollout period for the release this manifest gives the device, before its own
    /// refusals: each member's report goes again with the new sequence and arm, whatever the
    /// check does next (docs/protocol.md §11, "Every rollout period, both arms").
    func reportPeriod(_ unit: ReleaseUnit, _ decision: Decision) async {
        guard let entry = decision.entry else { return }
        for name in entry.members(unit: unit.name).keys.sorted() {
            await reporter.period(unit: unit.name, model: name, unitVersion: entry.version, arm: decision.isCandidate ? "candidate" : "stable",
                                  sequence: decision.manifest.sequence, reportURL: decision.manifest.reportURL)
        }
    }

    /// A release this device refused for good counts as not fitting (§8).
    func avoidBad(_ unit: ReleaseUnit, _ decision: Decision, bad: [String: String]) throws -> Decision {
        guard let entry = decision.entry, let why = bad[entry.version] else { return decision }
        if decision.isCandidate, let stable = decision.manifest.stable, bad[stable.version] == nil,
            case .success(let fitted) = Decide.fit(stable, appFacts)
        {
            return Decision(manifest: decision.manifest, entry: fitted.entry, isCandidate: false, sequence: decision.sequence,
                            fallback: Reason.badRelease, substitute: fitted.substitute)
        }
        throw Failure(code: Reason.badRelease, message: "\(unit.name) \(entry.version) was refused on this device before (\(why)); it is not installed again")
    }

    func apply(_ unit: ReleaseUnit, _ decision: Decision, installed: InstalledSet?, conditions: Conditions, notModified: Bool,
               shipped: BundledRelease?) async throws -> UpdateResult {
        guard let entry = decision.entry else {
            try setPending(unit, nil)
            return UpdateResult(unit: unit, tier: tier, errorCode: nil, error: nil, version: nil, isCandidate: false,
                                updated: false, notModified: notModified, fallback: nil, substitute: nil, deferred: nil,
                                bundled: false, downloadedBytes: 0, members: [:])
        }
        let entries = entry.members(unit: unit.name)
        for (name, e) in entries {
            if let labels = e.contract?.labelsBlob, labels.size > Labels.maxBytes {
                throw Failure(code: Reason.malformed, message: "the labels blob of \(name) is \(labels.size) bytes, more than \(Labels.maxBytes)")
            }
            if let data = e.probeData, data.size > GoldenProbe.maxDataBytes {
                // Refused before any byte (docs/protocol.md §11).
                throw Failure(code: Reason.malformed, message: "the probe data of \(name) declares \(data.size) bytes, more than \(GoldenProbe.maxDataBytes)")
            }
        }
        var new = InstalledSet(version: entry.version, tier: tier ?? "", isCandidate: decision.isCandidate,
                               sequence: decision.manifest.sequence, bundled: shipped != nil, token: nil,
                               reportURL: decision.manifest.reportURL,
                               members: entries.mapValues { InstalledSet.Member(entry: $0, backend: nil) }, metrics: entry.metrics)
        if let installed, new.sameRelease(installed) {
            // Same blobs (a promote, a re-fetch): keep the check's backends, the token and the last good.
            var kept = new
            for (name, m) in installed.members { kept.members[name]?.backend = m.backend }
            kept.previous = installed.previous
            kept.bundled = installed.bundled && shipped != nil
            kept.token = installed.token
            if kept != installed { try catching { () throws(CacheError) in try writeInstalled(unit, kept) } }
            try setPending(unit, nil)
            return result(unit, kept, notModified: notModified, decision: decision)
        }
        var seen = Set<String>()
        let missing = entries.keys.sorted().flatMap { entries[$0]!.blobs }.filter { seen.insert($0.sha256).inserted && !layout.hasBlob($0) }
        var downloaded: Int64 = 0
        if !missing.isEmpty {
            if shipped == nil {
                let deferred = configuration.policy.unmet(conditions)
                try setPending(unit, new, missing: missing, deferred: deferred)
                if let deferred {
                    let base = result(unit, installed, notModified: notModified)
                    return UpdateResult(unit: unit, tier: tier, errorCode: nil, error: nil, version: base.version,
                                        isCandidate: base.isCandidate, updated: false, notModified: notModified, fallback: nil,
                                        substitute: nil, deferred: deferred, bundled: base.bundled, downloadedBytes: 0, members: base.members)
                }
            }
            try preflight(missing)
            if shipped == nil {
                var kept: Int64 = 0
                for ref in missing { kept += min(ref.size, Files.size(layout.part(ref.sha256)) ?? 0) }
                tally = ProgressTally(total: missing.reduce(0) { $0 + $1.size }, done: kept, report: progress)
            }
            defer { tally = nil }
            for ref in missing {
                try checkpoint()
                if let shipped {
                    try copyShipped(ref, shipped)
                } else {
                    downloaded += try await download(ref)
                }
            }
        }
        for (name, e) in entries { _ = try labels(name, e) }  // a bad labels blob refuses the release
        try checkpoint()
        do {
            new = try await check(unit, new, entries)
        } catch let f as Failure where f.code == Reason.probeNotRun {
            throw f  // no verdict: the release stays pending, nothing is reported (§11, rule 20)
        } catch let f as Failure {
            try? setPending(unit, nil)
            if f.permanent { markBad(unit, new.version, "\(f.code): \(f.message)") }
            if configuration.reporting {
                let token = Reporter.newToken()
                for name in entries.keys.sorted() {
                    await reporter.installed(facts(unit, new, name, decision, token: token, trial: lastTrials[name]),
                                             reportURL: decision.manifest.reportURL, refused: true)
                }
            }
            throw f
        }
        if let installed {
            var prev = installed
            prev.previous = []
            new.previous = [prev]
        }
        new.token = configuration.reporting ? Reporter.newToken() : nil
        try checkpoint()  // the last moment a cancel counts: the switch is next
        try catching { () throws(CacheError) in try writeInstalled(unit, new) }
        try setPending(unit, nil)
        evict()
        var ledger = readHealth()
        ledger[unit.name, default: UnitHealth()].onInstall(new.version, duringStart: startedUnits.contains(unit.name))
        writeHealth(ledger)
        if let token = new.token {
            for name in new.members.keys.sorted() {
                await reporter.installed(facts(unit, new, name, decision, token: token, trial: lastTrials[name]),
                                         reportURL: decision.manifest.reportURL)
            }
        }
        let lower = installed.map { (DottedVersion.compare(new.version, $0.version) ?? 0) < 0 } ?? false
        announce(ModelChange(unit: unit, kind: lower ? .rolledBack : .installed, version: new.version, previous: installed?.version))
        return result(unit, new, updated: true, notModified: notModified, downloaded: downloaded, decision: decision)
    }

    // MARK: network

    func getManifest(_ unit: ReleaseUnit, tier: String, cached: Data?, etag: String?) async throws -> (Data, String?, Bool) {
        let path = "manifests/\(unit.name)/\(tier).json"
        guard let url = URL(string: path, relativeTo: configuration.registry) else {
            throw Failure(code: Reason.transport, message: "bad registry URL")
        }
        var headers: [String: String] = [:]
        if cached != nil, let etag { headers["If-None-Match"] = etag }
        let response: StreamedResponse
        do {
            response = try await transport.get(url.absoluteURL, headers: headers)
        } catch let e as TransportError {
            throw e.failure
        }
        defer { response.close() }
        if response.status == 304, let cached {
            // Verified again by the caller: the cached copy may have expired.
            return (cached, response.header("etag") ?? etag, true)
        }
        if response.status == 404 {
            throw Failure(code: Reason.notFound, message: "the registry has no manifest for \(unit.name), tier \(tier) (\(url.absoluteString) answered 404)")
        }
        guard response.status == 200 else {
            throw Failure(code: Reason.transport, message: "\(url.absoluteString) answered HTTP \(response.status), expected 200" + Self.redirectNote(response))
        }
        let limit = Envelope.maxManifestBytes
        if let length = response.contentLength, length > Int64(limit) {
            throw Failure(code: Reason.malformed, message: "manifest is \(length) bytes, more than the limit of \(limit)")
        }
        var data = Data()
        do {
            while data.count <= limit, let chunk = try await response.next() {
                data.append(chunk)
            }
        } catch let e as TransportError {
            throw e.failure
        }
        // One byte past the limit is enough to refuse it (rule 1 decides).
        return (data.prefix(limit + 1), response.header("etag"), false)
    }

    /// What a 3xx answer left standing says: a redirect that was not followed (only http(s)
    /// redirects are, and the socket transport follows none).
    static func redirectNote(_ response: StreamedResponse) -> String {
        guard (300..<400).contains(response.status), let location = response.header("location") else { return "" }
        return " (a redirect to \(location.prefix(200)), not followed: only http(s) redirects are)"
    }

    /// Download, verify and move a blob into the cache; the bytes transferred.
    func download(_ ref: BlobRef) async throws -> Int64 {
        guard Date() < deadline else {
            throw Failure(code: Reason.transport, message: "the update went past its deadline of \(Int(configuration.limits.deadline)) s; the next update resumes")
        }
        let part = layout.part(ref.sha256)
        try catching { () throws(CacheError) in
            do {
                try FileManager.default.createDirectory(at: layout.blobs, withIntermediateDirectories: true)
            } catch {
                throw CacheError(message: "cannot create \(layout.blobs.path)")
            }
        }
        var check = BlobCheck(sha256: ref.sha256, size: ref.size)
        var have: Int64 = 0
        if let size = Files.size(part) {
            if size > ref.size {
                Files.remove(part)
            } else if let handle = FileHandle(forReadingAtPath: part.path) {
                defer { try? handle.close() }
                while let chunk = try? handle.read(upToCount: 1 << 20), !chunk.isEmpty {
                    try catching { () throws(Rejection) in try check.update(chunk) }
                }
                have = size
            }
        }
        var transferred: Int64 = 0
        if check.remaining > 0 {
            transferred = try await transfer(ref, part: part, check: &check, have: have)
        }
        do {
            try check.finish()
        } catch {
            Files.remove(part)
            throw error.failure
        }
        guard rename(part.path, layout.blob(ref.sha256).path) == 0 else {
            throw Failure(code: Reason.cache, message: "cannot install \(part.lastPathComponent)")
        }
        Files.fsyncDirectory(layout.blobs)
        return transferred
    }

    func transfer(_ ref: BlobRef, part: URL, check: inout BlobCheck, have: Int64) async throws -> Int64 {
        guard let url = URL(string: ref.path, relativeTo: configuration.registry)?.absoluteURL else {
            throw Failure(code: Reason.transport, message: "bad registry URL")
        }
        let tally = self.tally
        var onBytes: (@Sendable (Int64) -> Void)?
        if let tally { onBytes = { @Sendable (count: Int64) in tally.add(count) } }
        var writer = BlobWriter(part: part, check: check, have: have, url: url.absoluteString, limits: configuration.limits, deadline: deadline,
                                onBytes: onBytes)
        do {
            try await transport.fetch(url, headers: have > 0 ? ["Range": "bytes=\(have)-"] : [:], into: writer)
            try checkpoint()
            if writer.restart {
                // The server refused the range (416) or answered another one: start over.
                Files.remove(part)
                check.reset()
                tally?.add(-have)
                writer = BlobWriter(part: part, check: check, have: 0, url: url.absoluteString, limits: configuration.limits, deadline: deadline,
                                    onBytes: onBytes)
                try await transport.fetch(url, headers: [:], into: writer)
                try checkpoint()
            }
        } catch let e as TransportError {
            try checkpoint()  // cut by the app's cancel: cancelled, the part kept
            throw Failure(code: Reason.transport, message: "\(e.message); \(writer.transferred) bytes kept for a resume")
        }
        let (result, failure, transferred) = writer.outcome
        check = result
        if let failure { throw failure }
        guard check.remaining == 0 else {
            guard writer.announced else {
                // No Content-Length: the body's end is the answer's end, and a short answer
                // is another file, which asking again would bring back (rule 14).
                Files.remove(part)
                throw Failure(code: Reason.badBlob, message: "\(url.absoluteString): the answer ended after \(check.received) of \(check.size) bytes with no Content-Length; the server holds a different file under this digest")
            }
            throw Failure(code: Reason.transport, message: "\(url.absoluteString): connection closed after \(check.received) of \(check.size) bytes; the next update resumes")
        }
        return transferred
    }

    func preflight(_ missing: [BlobRef]) throws {
        var remaining: Int64 = 0
        for ref in missing { remaining += max(0, ref.size - (Files.size(layout.part(ref.sha256)) ?? 0)) }
        try? FileManager.default.createDirectory(at: layout.root, withIntermediateDirectories: true)
        guard let free = Files.freeBytes(layout.root) else {
            throw Failure(code: Reason.cache, message: "cannot check the free space of \(layout.root.path)")
        }
        let needed = remaining + configuration.policy.reserveBytes
        if free < needed {
            throw Failure(code: Reason.noSpace, message: "the download needs \(needed) bytes (\(remaining) to fetch and a reserve of \(configuration.policy.reserveBytes)) and \(layout.root.path) has \(free) free; nothing was downloaded")
        }
    }

    func copyShipped(_ ref: BlobRef, _ shipped: BundledRelease) throws {
        guard let source = shipped.blob(ref.sha256), let data = try? Data(contentsOf: source) else {
            throw Failure(code: Reason.malformed, message: "the shipped release has no blob \(ref.sha256.prefix(12)) in \(shipped.blobsDirectory.path)")
        }
        var check = BlobCheck(sha256: ref.sha256, size: ref.size)
        try catching { () throws(Rejection) in
            try check.update(data)
            try check.finish()
        }
        try catching { () throws(CacheError) in try Files.atomicWrite(data, to: layout.blob(ref.sha256)) }
    }

    static let maxLabelsBytes: Int64 = Labels.maxBytes

    /// A member's labels: inline, or the verified labels blob parsed as a list of strings.
    func labels(_ name: String, _ entry: ModelEntry) throws -> [String]? {
        guard let contract = entry.contract else { return nil }
        if let labels = contract.labels { return labels }
        guard let blob = contract.labelsBlob else { return nil }
        guard blob.size <= EdgeRegClient.maxLabelsBytes else {
            throw Failure(code: Reason.malformed, message: "the labels blob of \(name) is \(blob.size) bytes, more than \(EdgeRegClient.maxLabelsBytes)")
        }
        guard let data = try? Data(contentsOf: layout.blob(blob.sha256)) else {
            throw Failure(code: Reason.cache, message: "cannot read the labels of \(name)")
        }
        guard let strings = Labels.parse(data) else {
            throw Failure(code: Reason.malformed, message: "the labels blob of \(name) is not a JSON array of strings")
        }
        return strings
    }

    // MARK: the shipped release

    func installShippedIfAny(_ unit: ReleaseUnit) async {
        guard let shipped = configuration.bundled[unit.name] else { return }
        do {
            try await installShipped(unit, shipped)
        } catch let f as Failure {
            recordError(unit, Failure(code: f.code, message: "shipped release: \(f.message)"))
        } catch {
            recordError(unit, Failure(code: Reason.cache, message: "shipped release: \(error)"))
        }
    }

    /// Verified like a fetched manifest except its expiry; only while no manifest was ever accepted
    /// online, and only above what is installed (§10). It never writes the highest sequence seen: a
    /// shipped manifest signed with a huge sequence by mistake would make every online one a rollback.
    func installShipped(_ unit: ReleaseUnit, _ shipped: BundledRelease) async throws {
        guard let tier else { return }
        if try readSequence(unit) != nil { return }
        let installed = try readInstalled(unit)
        var input = Decide.Input(manifest: shipped.manifest, trusted: configuration.trustedKeys, unit: unit.name, tier: tier,
                                 deviceID: configuration.device.deviceID, app: appFacts,
                                 highestSeenSequence: nil, now: now, bundle: unit.isBundle)
        input.ignoreExpiry = true
        let decision = try catching { () throws(Rejection) in try Decide.decide(input) }
        if let installed, decision.manifest.sequence <= installed.sequence { return }
        let chosen = try avoidBad(unit, decision, bad: readBad(unit))
        guard chosen.entry != nil else { return }
        _ = try await apply(unit, chosen, installed: installed, conditions: Conditions(), notModified: false, shipped: shipped)
    }

    // MARK: results

    /// What this device knows of itself for an entry's `runtime_hints` (§11): the report's CPU
    /// class, the core count, and on iOS `hw.machine` cut to its family (`iPhone15`).
    var hintFacts: HintFacts {
        HintFacts(cpuClass: CPUFeatures.cpuClass(configuration.device.cpuFeatures),
                  cores: configuration.device.cpuCores.map { Int($0) }, soc: HintFacts.platformSoC)
    }

    func result(_ unit: ReleaseUnit, _ set: InstalledSet?, error: Failure? = nil, updated: Bool = false, notModified: Bool = false,
                downloaded: Int64 = 0, decision: Decision? = nil) -> UpdateResult {
        var members: [String: InstalledModel] = [:]
        for (name, m) in set?.members ?? [:] {
            let e = m.entry
            // The stored entry is the last verified manifest's: a rule changed with no new blob applies.
            let choice = RuntimeChoice(entry: e, facts: hintFacts, deviceID: configuration.device.deviceID)
            members[name] = InstalledModel(
                name: name, path: layout.blob(e.sha256), version: e.version, variant: e.variant, sha256: e.sha256,
                runtime: choice.runtime, runtimeRule: choice.rule, minMnnRuntime: e.minMnnRuntime, contract: e.contract, labels: (try? labels(name, e)) ?? nil,
                probePath: e.probe.map { layout.blob($0.sha256) }, backend: m.backend)
        }
        return UpdateResult(unit: unit, tier: tier, errorCode: error?.code, error: error?.message, version: set?.version,
                            isCandidate: set?.isCandidate ?? false, updated: updated, notModified: notModified,
                            fallback: decision?.fallback, substitute: decision?.substitute, deferred: nil,
                            bundled: set?.bundled ?? false, downloadedBytes: downloaded, members: members)
    }

    // MARK: cache records

    func readInstalled(_ unit: ReleaseUnit) throws(CacheError) -> InstalledSet? {
        guard let all = try Files.readJSON(layout.installedFile) else { return nil }
        guard let value = all[unit.isBundle ? "bundles" : "models"]?[unit.name], !value.isNull else { return nil }
        guard let set = InstalledSet(json: value) else {
            throw CacheError(message: "\(layout.installedFile.path) holds an unreadable record for \(unit)")
        }
        return set
    }

    func writeInstalled(_ unit: ReleaseUnit, _ set: InstalledSet?) throws(CacheError) {
        var all = try Files.readJSON(layout.installedFile) ?? JSONObject()
        let key = unit.isBundle ? "bundles" : "models"
        var group = all[key]?.objectValue ?? JSONObject()
        group[unit.name] = set?.json
        all[key] = .object(group)
        defer { declaredMetrics.invalidate() }
        try Files.writeJSON(all, to: layout.installedFile)
    }

    func installedUnitNames() -> [ReleaseUnit] {
        guard let all = try? Files.readJSON(layout.installedFile) else { return [] }
        return (all["models"]?.objectValue?.keys.map { ReleaseUnit.model($0) } ?? [])
            + (all["bundles"]?.objectValue?.keys.map { ReleaseUnit.bundle($0) } ?? [])
    }

    /// The highest sequence accepted; an unreadable file is never taken as "nothing seen".
    func readSequence(_ unit: ReleaseUnit) throws -> Int64? {
        let file = layout.sequenceFile(unit.name)
        let o = try catching { () throws(CacheError) in try Files.readJSON(file) }
        guard let o else { return nil }
        guard let seq = o["sequence"]?.intValue else {
            throw Failure(code: Reason.cache, message: "\(file.path) is corrupt; refusing to update (starting over would accept a replayed manifest)")
        }
        return seq
    }

    func readBad(_ unit: ReleaseUnit) -> [String: String] {
        guard let o = try? Files.readJSON(layout.badFile(unit.name)) else { return [:] }
        var out: [String: String] = [:]
        for k in o.keys { out[k] = o[k]?.stringValue ?? "" }
        return out
    }

    func markBad(_ unit: ReleaseUnit, _ version: String, _ why: String) {
        var o = (try? Files.readJSON(layout.badFile(unit.name))) ?? JSONObject()
        o[version] = .string(why)
        try? Files.writeJSON(o, to: layout.badFile(unit.name))
    }

    func setPending(_ unit: ReleaseUnit, _ new: InstalledSet?, missing: [BlobRef] = [], deferred: String? = nil) throws {
        let file = layout.statusFile(unit.name)
        var status = (try? Files.readJSON(file)) ?? JSONObject()
        if let new {
            let old = status["pending"]?.objectValue
            let since = old?["version"]?.stringValue == new.version ? (old?["since"]?.stringValue ?? WireTime.format(now)) : WireTime.format(now)
            status["pending"] = .object(JSONObject([
                ("version", .string(new.version)), ("is_candidate", .bool(new.isCandidate)),
                ("blobs", .array(missing.map { .object(JSONObject([("sha256", .string($0.sha256)), ("size", .int($0.size))])) })),
                ("deferred", deferred.map { .string($0) } ?? .null), ("since", .string(since)),
            ]))
        } else {
            guard let p = status["pending"], !p.isNull else { return }
            status["pending"] = .null
        }
        try catching { () throws(CacheError) in try Files.writeJSON(status, to: file) }
    }

    func recordError(_ unit: ReleaseUnit, _ failure: Failure?) {
        let file = layout.statusFile(unit.name)
        var status = (try? Files.readJSON(file)) ?? JSONObject()
        if let failure {
            status["last_error"] = .object(JSONObject([
                ("code", .string(failure.code)), ("message", .string(failure.message)), ("at", .string(WireTime.format(now))),
            ]))
        } else {
            guard let e = status["last_error"], !e.isNull else { return }
            status["last_error"] = .null
        }
        try? Files.writeJSON(status, to: file)
    }

    /// Delete every blob no installed set, last good set or pending download references.
    func evict() {
        var keep = Set<String>()
        if let all = try? Files.readJSON(layout.installedFile) {
            for group in ["models", "bundles"] {
                guard let o = all[group]?.objectValue else { continue }
                for k in o.keys {
                    guard let set = o[k].flatMap(InstalledSet.init(json:)) else { return }  // unreadable: evict nothing
                    keep.formUnion(set.blobs.map(\.sha256))
                    keep.formUnion(set.previous.flatMap(\.blobs).map(\.sha256))
                }
            }
        }
        let stateRoot = layout.root.appendingPathComponent("state")
        for unit in (try? FileManager.default.contentsOfDirectory(atPath: stateRoot.path)) ?? [] {
            guard let status = try? Files.readJSON(layout.statusFile(unit)) else { continue }
            for blob in status["pending"]?["blobs"]?.arrayValue ?? [] {
                if let sha = blob["sha256"]?.stringValue { keep.insert(sha) }
            }
        }
        for name in (try? FileManager.default.contentsOfDirectory(atPath: layout.blobs.path)) ?? [] {
            let sha = name.hasSuffix(".part") ? String(name.dropLast(5)) : name
            if Fields.isSha256(sha), !keep.contains(sha) { Files.remove(layout.blobs.appendingPathComponent(name)) }
        }
    }

    func hashFile(_ url: URL) -> String? {
        guard let handle = FileHandle(forReadingAtPath: url.path) else { return nil }
        defer { try? handle.close() }
        var hasher = SHA256Hasher()
        while let chunk = try? handle.read(upToCount: 1 << 20), !chunk.isEmpty { hasher.update(chunk) }
        return hasher.finalize().hexString
    }

    // MARK: health ledger

    func readHealth() -> [String: UnitHealth] {
        guard let o = try? Files.readJSON(layout.healthFile) else { return [:] }
        var out: [String: UnitHealth] = [:]
        for k in o.keys { out[k] = UnitHealth(json: o[k]!) }
        return out
    }

    func writeHealth(_ ledger: [String: UnitHealth]) {
        try? Files.writeJSON(JSONObject(ledger.keys.sorted().map { ($0, ledger[$0]!.json) }), to: layout.healthFile)
    }

    // MARK: self-test

    var lastTrials: [String: SelfTestOutcome] = [:]
    /// The units `appStarted` was called for in this process: an install of one now runs
    /// under that start (docs/protocol.md §11).
    var startedUnits: Set<String> = []

    /// The app's facts for the fit rule, with the MNN APIs of its runner when the self-test has one (rule (f)).
    var appFacts: AppFacts {
        var facts = configuration.device.appFacts
        if configuration.selfTest, let runner = configuration.runner { facts.mnnAPIs = runner.mnnAPIs }
        return facts
    }

    func check(_ unit: ReleaseUnit, _ new: InstalledSet, _ entries: [String: ModelEntry]) async throws -> InstalledSet {
        lastTrials = [:]
        guard configuration.selfTest else { return new }
        var out = new
        for name in entries.keys.sorted() {
            let entry = entries[name]!
            var probe: GoldenProbe?
            if let ref = entry.probe {
                guard let data = try? Data(contentsOf: layout.blob(ref.sha256)) else {
                    throw Failure(code: Reason.badBlob, message: "probe of \(name) \(entry.version) unreadable")
                }
                var tensors: Data?
                if let dataRef = entry.probeData {
                    guard let raw = try? Data(contentsOf: layout.blob(dataRef.sha256)) else {
                        throw Failure(code: Reason.badBlob, message: "probe data of \(name) \(entry.version) unreadable")
                    }
                    tensors = raw
                }
                do {
                    probe = try GoldenProbe(data: data, artifactSHA256: entry.sha256, dataSHA256: entry.probeData?.sha256,
                                            tensorData: tensors)
                } catch {
                    throw Failure(code: Reason.malformed, message: "the probe of \(name) \(entry.version): \(error.message)")
                }
            }
            let outcome = await SelfTest(layout: layout, runner: configuration.runner)
                .run(model: name, artifact: layout.blob(entry.sha256), entry: entry, probe: probe)
            lastTrials[name] = outcome
            if outcome.notRun {
                throw Failure(code: Reason.probeNotRun, message: "\(name) \(entry.version): the self-test could not run the probe on this device (\(outcome.why)); nothing is marked bad, the next update tries again")
            }
            guard let backend = outcome.backend else {
                throw Failure(code: Reason.probeFailed, message: "\(name) \(entry.version) (variant \(entry.variant)) failed its self-test on every backend: \(outcome.why)", permanent: true)
            }
            out.members[name]?.backend = backend
        }
        return out
    }

    func facts(_ unit: ReleaseUnit, _ set: InstalledSet, _ name: String, _ decision: Decision, token: String,
               trial: SelfTestOutcome?) -> ReportFacts {
        let m = set.members[name]!
        var probe = "none"
        if let trial { probe = trial.backend == nil ? "failed" : (trial.probed ? "passed" : "none") }
        return ReportFacts(token: token, unit: unit.name, model: name, version: m.entry.version, unitVersion: set.version,
                           variant: m.entry.variant, tier: set.tier, arm: set.isCandidate ? "candidate" : "stable",
                           sequence: decision.manifest.sequence, probe: probe, backend: trial?.backend ?? m.backend,
                           backendsSkipped: trial?.skipped ?? [], loadMs: trial?.loadMs,
                           loadFailed: trial.map { $0.backend == nil && !$0.failures.isEmpty && $0.failures.allSatisfy { $0.hasPrefix("does not load") } } ?? false)
    }
}

/// Maps a typed error to a Failure.
@inline(__always)
func catching<T, E: Error>(_ body: () throws(E) -> T) throws -> T {
    do {
        return try body()
    } catch let e as Rejection {
        throw e.failure
    } catch let e as CacheError {
        throw e.failure
    } catch let e as TransportError {
        throw e.failure
    } catch {
        throw error
    }
}

/// A release's download progress, told to the app as bytes arrive (on the transport's queue).
final class ProgressTally: @unchecked Sendable {
    private let lock = NSLock()
    private let total: Int64
    private var done: Int64
    private let report: (@Sendable (Int64, Int64) -> Void)?

    init(total: Int64, done: Int64, report: (@Sendable (Int64, Int64) -> Void)?) {
        self.total = total
        self.done = done
        self.report = report
        report?(done, total)  // the total, before the first byte
    }

    func add(_ count: Int64) {
        let now = lock.withLock { () -> Int64 in
            done += count
            return done
        }
        report?(now, total)
    }
}
