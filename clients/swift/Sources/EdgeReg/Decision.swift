import Foundation

/// A rejection: the reason code of the rule broken (docs/protocol.md §7) and what was found.
public struct Rejection: Error, Sendable, Equatable, CustomStringConvertible {
    public let reason: String
    public let message: String

    public init(_ reason: String, _ message: String) {
        self.reason = reason
        self.message = message
    }

    public var description: String { "\(reason): \(message)" }

    static func malformed(_ message: String) -> Rejection { Rejection("malformed", message) }
}

/// The reason codes of docs/protocol.md §7 and §11, in rule order.
public enum Reason {
    public static let malformed = "malformed"
    public static let unknownKey = "unknown-key"
    public static let badSignature = "bad-signature"
    public static let wrongModel = "wrong-model"
    public static let wrongTier = "wrong-tier"
    public static let rollback = "rollback"
    public static let expired = "expired"
    public static let runtimeTooOld = "runtime-too-old"
    public static let appIncompatible = "app-incompatible"
    public static let osIncompatible = "os-incompatible"
    public static let insufficientMemory = "insufficient-memory"
    /// Also the decision's `substitute` when the device got an entry's `instead`.
    public static let cpuUnsupported = "cpu-unsupported"
    public static let blobTooLarge = "blob-too-large"
    public static let badBlob = "bad-blob"
    public static let probeFailed = "probe-failed"
    // client codes
    /// The self-test could not run the probe (no CPU from the runner): no verdict (§11, rule 20).
    public static let probeNotRun = "probe-not-run"
    public static let cancelled = "cancelled"
    public static let transport = "transport"
    public static let notFound = "not-found"
    public static let cache = "cache"
    public static let noSpace = "no-space"
    public static let badRelease = "bad-release"
    public static let untrusted = "untrusted"
    public static let reverted = "reverted"
}

public enum Envelope {
    public static let manifestType = "application/vnd.edgereg.manifest+json"
    public static let maxManifestBytes = 64 * 1024

    /// DSSE pre-authentication encoding: what a signature covers.
    public static func pae(_ payloadType: String, _ payload: Data) -> Data {
        var out = Data("DSSEv1 \(payloadType.utf8.count) \(payloadType) \(payload.count) ".utf8)
        out.append(payload)
        return out
    }

    /// Rules 2–5: check the envelope and return its payload bytes.
    public static func verify(_ bytes: Data, trusted: TrustedKeys, payloadType: String) throws(Rejection) -> Data {
        let value: JSONValue
        do {
            value = try StrictJSON.parse(bytes)
        } catch {
            throw .malformed("envelope is not JSON (\(error.message))")
        }
        guard let env = value.objectValue else { throw .malformed("envelope is a JSON \(value.kind), expected an object") }
        guard let payloadText = env["payload"]?.stringValue else { throw .malformed("envelope has no string 'payload'") }
        guard let type = env["payloadType"]?.stringValue else { throw .malformed("envelope has no string 'payloadType'") }
        guard let sigs = env["signatures"]?.arrayValue else { throw .malformed("envelope has no list 'signatures'") }
        guard !sigs.isEmpty else { throw .malformed("envelope has no signatures, expected at least one") }
        var keyids: [String] = []
        for (i, sig) in sigs.enumerated() {
            guard let keyid = sig.objectValue?["keyid"]?.stringValue else {
                throw .malformed("envelope signatures[\(i)] has no string 'keyid'")
            }
            keyids.append(keyid)
        }
        guard type == payloadType else {
            throw .malformed("envelope payload type is '\(type)', expected '\(payloadType)'")
        }
        let byTrusted = keyids.indices.filter { trusted.byID[keyids[$0]] != nil }
        guard !byTrusted.isEmpty else {
            throw Rejection(Reason.unknownKey, "no signature by a trusted key: signed by \(keyids.map { String($0.prefix(12)) }.joined(separator: ", "))")
        }
        guard let payload = Base64.decodeCanonical(payloadText) else {
            throw Rejection(Reason.badSignature, "envelope payload is not canonical standard base64")
        }
        let message = pae(type, payload)
        for index in byTrusted {
            let keyid = keyids[index]
            guard let sigText = sigs[index].objectValue?["sig"]?.stringValue else {
                throw Rejection(Reason.badSignature, "signature \(index) by trusted key \(keyid.prefix(12)) has no 'sig'")
            }
            guard let sig = Base64.decodeCanonical(sigText) else {
                throw Rejection(Reason.badSignature, "signature \(index) is not canonical standard base64")
            }
            guard Ed25519.verify(signature: sig, message: message, publicKey: trusted.byID[keyid]!.raw) else {
                throw Rejection(Reason.badSignature, "signature \(index) by trusted key \(keyid.prefix(12)) does not verify")
            }
        }
        return payload
    }
}

/// What the app says about itself for the fit rule (nil: not said).
public struct AppFacts: Sendable, Equatable {
    public var mnnRuntime: String?
    public var appVersion: String?
    public var os: String?
    public var osVersion: String?
    /// The device's CPU features (`i8mm`, `dotprod`...); nil skips fit rule (e), an empty set has none.
    public var cpuFeatures: Set<String>?
    /// How much memory one model (or one bundle, its members together) may take, MiB; nil skips rule (d).
    public var memoryBudgetMB: Double?

    public init(mnnRuntime: String? = nil, appVersion: String? = nil, os: String? = nil, osVersion: String? = nil,
                cpuFeatures: Set<String>? = nil, memoryBudgetMB: Double? = nil) {
        self.mnnRuntime = mnnRuntime
        self.appVersion = appVersion
        self.os = os
        self.osVersion = osVersion
        self.cpuFeatures = cpuFeatures
        self.memoryBudgetMB = memoryBudgetMB
    }
}

/// What a verified manifest means for this device.
public struct Decision: Sendable {
    public let manifest: Manifest
    /// What the device should install, or nil (a first release still a canary, outside the
    /// cohort): the manifest's entry, or its `instead` (a bundle: with those members replaced).
    public let entry: Entry?
    public let isCandidate: Bool
    /// The highest sequence seen, this manifest's included: what the client stores.
    public let sequence: Int64
    /// Why the candidate was passed over for stable (a rule-12 reason, or `bad-release`).
    public let fallback: String?
    /// `cpu-unsupported` when `entry` is (or, for a bundle, holds) an `instead`, else nil.
    public var substitute: String? = nil
    public var runtimeFallback: Bool { fallback != nil }
}

/// An entry that fits the app: what the device installs for it (fit rule, docs/protocol.md §7).
public struct Fit: Sendable {
    /// The manifest's entry, or its `instead` (a bundle: substituted members replaced).
    public let entry: Entry
    /// `cpu-unsupported` when an `instead` was taken, else nil.
    public let substitute: String?
}

/// The pure decision of docs/protocol.md §7: no sockets, no files, the clock passed in.
public enum Decide {
    public struct Input: Sendable {
        public var manifest: Data
        public var trusted: TrustedKeys
        public var unit: String
        public var tier: String
        public var deviceID: String
        public var app: AppFacts
        public var highestSeenSequence: Int64?
        public var now: Int64
        public var bundle: Bool
        /// Versions refused for good on this device (§8, bad releases).
        public var badVersions: Set<String> = []
        /// A shipped release: its expiry is not checked (docs/protocol.md §10).
        public var ignoreExpiry = false

        public init(manifest: Data, trusted: TrustedKeys, unit: String, tier: String, deviceID: String, app: AppFacts,
                    highestSeenSequence: Int64?, now: Int64, bundle: Bool) {
            self.manifest = manifest
            self.trusted = trusted
            self.unit = unit
            self.tier = tier
            self.deviceID = deviceID
            self.app = app
            self.highestSeenSequence = highestSeenSequence
            self.now = now
            self.bundle = bundle
        }
    }

    public static func decide(_ input: Input) throws(Rejection) -> Decision {
        guard input.manifest.count <= Envelope.maxManifestBytes else {
            throw .malformed("manifest is \(input.manifest.count) bytes, more than the limit of \(Envelope.maxManifestBytes)")
        }
        let payload = try Envelope.verify(input.manifest, trusted: input.trusted, payloadType: Envelope.manifestType)
        let manifest: Manifest
        do {
            manifest = try Manifest(payload: payload)
        } catch {
            throw .malformed("manifest is not valid: \(error.message)")
        }
        guard manifest.model == input.unit else {
            throw Rejection(Reason.wrongModel, "manifest is for model '\(manifest.model)', expected '\(input.unit)'")
        }
        guard manifest.tier == input.tier else {
            throw Rejection(Reason.wrongTier, "manifest is for tier '\(manifest.tier)', expected '\(input.tier)'")
        }
        if manifest.stable != nil || manifest.candidate != nil, manifest.isBundle != input.bundle {
            let (asked, got) = input.bundle ? ("bundle", "model") : ("model", "bundle")
            throw .malformed("the manifest of '\(manifest.model)' is a \(got)'s, the client asked for a \(asked)")
        }
        if let seen = input.highestSeenSequence, manifest.sequence < seen {
            throw Rejection(Reason.rollback, "sequence \(manifest.sequence) is older than \(seen) already seen")
        }
        if !input.ignoreExpiry, input.now >= manifest.expires {
            throw Rejection(Reason.expired, "manifest expired at \(WireTime.format(manifest.expires)) (now \(WireTime.format(input.now)))")
        }
        let sequence = max(manifest.sequence, input.highestSeenSequence ?? 0)
        guard let (entry, isCandidate) = choose(manifest, deviceID: input.deviceID) else {
            return Decision(manifest: manifest, entry: nil, isCandidate: false, sequence: sequence, fallback: nil)
        }
        let misfit: Rejection
        switch fit(entry, input.app, bad: input.badVersions) {
        case .success(let fitted):
            return Decision(manifest: manifest, entry: fitted.entry, isCandidate: isCandidate, sequence: sequence,
                            fallback: nil, substitute: fitted.substitute)
        case .failure(let r): misfit = r
        }
        if isCandidate, let stable = manifest.stable {
            switch fit(stable, input.app, bad: input.badVersions) {
            case .success(let fitted):
                return Decision(manifest: manifest, entry: fitted.entry, isCandidate: false, sequence: sequence,
                                fallback: misfit.reason, substitute: fitted.substitute)
            case .failure(let stableMisfit):
                throw Rejection(misfit.reason, "candidate \(entry.version) \(misfit.message); stable \(stable.version) \(stableMisfit.message)")
            }
        }
        throw Rejection(misfit.reason, "\(isCandidate ? "candidate" : "stable") \(entry.version) \(misfit.message)")
    }

    /// Rule 11: the candidate inside the cohort (not paused), else stable, else nothing.
    public static func choose(_ manifest: Manifest, deviceID: String) -> (Entry, Bool)? {
        if let candidate = manifest.candidate, !manifest.paused, let salt = manifest.salt, let percent = manifest.percent,
            Cohort.contains(deviceID: deviceID, salt: salt, percent: percent)
        {
            return (candidate, true)
        }
        if let stable = manifest.stable { return (stable, false) }
        return nil
    }

    /// Rule 12, (a) to (e) (and §8's bad releases): what the device installs for `entry`, or
    /// why it does not fit (the first rule broken).
    public static func fit(_ entry: Entry, _ facts: AppFacts, bad: Set<String> = []) -> Result<Fit, Rejection> {
        if bad.contains(entry.version) {
            return .failure(Rejection(Reason.badRelease, "was refused on this device before"))
        }
        switch entry {
        case .bundle(let b):
            return fitBundle(b, facts)
        case .model(let m):
            if let r = unfitModel(m, facts, memory: true) { return .failure(r) }
            return fitCPU(m, facts, memory: true).map { Fit(entry: .model($0), substitute: $0 == m ? nil : Reason.cpuUnsupported) }
        }
    }

    static func fitBundle(_ b: BundleEntry, _ facts: AppFacts) -> Result<Fit, Rejection> {
        if let r = unmet(b.requires, facts) { return .failure(r) }
        var chosen: [String: ModelEntry] = [:]
        for name in b.memberNames {
            let member = b.members[name]!
            // Members load together: (d) is the bundle's sum, checked after every member.
            let fitted = unfitModel(member, facts, memory: false).map { Result<ModelEntry, Rejection>.failure($0) }
                ?? fitCPU(member, facts, memory: false)
            switch fitted {
            case .failure(let r): return .failure(Rejection(r.reason, "(member \(name)) \(r.message)"))
            case .success(let m): chosen[name] = m
            }
        }
        if let budget = facts.memoryBudgetMB {
            let total = b.memberNames.reduce(0.0) { $0 + (chosen[$1]!.peakMemoryMB ?? 0) }
            if total > budget {
                let parts = b.memberNames.compactMap { n in chosen[n]!.peakMemoryMB.map { "\(n) \(mb($0))" } }
                return .failure(Rejection(
                    Reason.insufficientMemory,
                    "needs \(mb(total)) MiB for its members together (\(parts.joined(separator: ", "))), the device's budget is \(mb(budget)) MiB"))
            }
        }
        let substituted = chosen.filter { b.members[$0.key]! != $0.value }
        if substituted.isEmpty { return .success(Fit(entry: .bundle(b), substitute: nil)) }
        return .success(Fit(entry: .bundle(b.replacing(members: substituted)), substitute: Reason.cpuUnsupported))
    }

    static func mb(_ value: Double) -> String {
        value == value.rounded() && abs(value) < 1e15 ? String(Int64(value)) : String(value)
    }

    /// Rules (a) to (c), and (d) when `memory` (a bundle checks its members' sum instead).
    static func unfitModel(_ entry: ModelEntry, _ facts: AppFacts, memory: Bool) -> Rejection? {
        // A runtime that is not a version cannot be shown to be new enough.
        if let runtime = facts.mnnRuntime, DottedVersion.compare(entry.minMnnRuntime, runtime).map({ $0 > 0 }) ?? true {
            return Rejection(Reason.runtimeTooOld, "(\(entry.variant)) needs MNN \(entry.minMnnRuntime), the app has \(runtime)")
        }
        if let r = unmet(entry.requires, facts) { return r }
        if memory, let budget = facts.memoryBudgetMB, let peak = entry.peakMemoryMB, peak > budget {
            return Rejection(
                Reason.insufficientMemory,
                "(\(entry.variant)) needs \(mb(peak)) MiB at its peak, the device's budget is \(mb(budget)) MiB")
        }
        return nil
    }

    /// The features of `entry.avoid_cpu` this device has (empty when either is not said).
    static func avoided(_ entry: ModelEntry, _ facts: AppFacts) -> [String] {
        guard let avoid = entry.avoidCPU, let features = facts.cpuFeatures else { return [] }
        return avoid.filter(features.contains).sorted()
    }

    /// Rule (e) on an entry that passed (a) to (d): the entry itself, its `instead`, or why neither fits.
    static func fitCPU(_ entry: ModelEntry, _ facts: AppFacts, memory: Bool) -> Result<ModelEntry, Rejection> {
        let hit = avoided(entry, facts)
        if hit.isEmpty { return .success(entry) }
        let message = "(\(entry.variant)) must not run on a CPU with \(hit.joined(separator: ", "))"
        guard let instead = entry.instead else { return .failure(Rejection(Reason.cpuUnsupported, message)) }
        // The instead fits by every rule on its own (its memory alone only outside a bundle);
        // whatever it breaks, the entry's reason stays cpu-unsupported.
        var misfit = unfitModel(instead, facts, memory: memory)
        if misfit == nil {
            let own = avoided(instead, facts)
            if !own.isEmpty {
                misfit = Rejection(Reason.cpuUnsupported, "(\(instead.variant)) must not run on a CPU with \(own.joined(separator: ", "))")
            }
        }
        if let misfit { return .failure(Rejection(Reason.cpuUnsupported, "\(message), and its instead \(misfit.message)")) }
        return .success(instead)
    }

    static func unmet(_ requires: Requirements?, _ facts: AppFacts) -> Rejection? {
        guard let requires else { return nil }
        if let app = requires.app {
            guard let version = facts.appVersion else {
                return Rejection(Reason.appIncompatible, "needs app \(app), the app did not say its version")
            }
            if DottedVersion.satisfies(version, app) != true {
                return Rejection(Reason.appIncompatible, "needs app \(app), the app is \(version)")
            }
        }
        for (name, wanted) in [("android", requires.android), ("ios", requires.ios)] {
            guard let wanted, facts.os == name else { continue }
            guard let version = facts.osVersion else {
                return Rejection(Reason.osIncompatible, "needs \(name) \(wanted), the device did not say its version")
            }
            if DottedVersion.satisfies(version, wanted) != true {
                return Rejection(Reason.osIncompatible, "needs \(name) \(wanted), the device has \(version)")
            }
        }
        return nil
    }
}

/// Rules 13–14: a blob checked chunk by chunk against its entry (pure, incremental).
public struct BlobCheck: Sendable {
    public let sha256: String
    public let size: Int64
    public private(set) var received: Int64 = 0
    private var hasher = SHA256Hasher()

    public init(sha256: String, size: Int64) {
        self.sha256 = sha256
        self.size = size
    }

    public var remaining: Int64 { size - received }

    public mutating func reset() {
        received = 0
        hasher = SHA256Hasher()
    }

    /// Refuse up front a body announced longer or shorter than what remains (rules 13–14):
    /// a complete answer of another length is another file, and asking again brings the
    /// same bytes. A body that then ends before `length` is a cut connection: the
    /// caller's transport failure, resumed later.
    public func expect(_ length: Int64?) throws(Rejection) {
        if let length, length > remaining {
            throw Rejection(Reason.blobTooLarge, "the server announces \(received + length) bytes for blob \(sha256.prefix(12)), the manifest declares \(size)")
        }
        if let length, length < remaining {
            throw Rejection(Reason.badBlob, "the server announces \(received + length) bytes for blob \(sha256.prefix(12)), the manifest declares \(size)")
        }
    }

    public mutating func update(_ chunk: Data) throws(Rejection) {
        guard Int64(chunk.count) <= remaining else {
            throw Rejection(Reason.blobTooLarge, "blob \(sha256.prefix(12)) is larger than the \(size) bytes the manifest declares; stopped reading")
        }
        received += Int64(chunk.count)
        hasher.update(chunk)
    }

    public mutating func finish() throws(Rejection) {
        guard received == size else {
            throw Rejection(Reason.badBlob, "blob \(sha256.prefix(12)) is \(received) bytes, the manifest declares \(size)")
        }
        let digest = hasher.finalize().hexString
        guard digest == sha256 else {
            throw Rejection(Reason.badBlob, "blob has sha256 \(digest.prefix(12))…, the manifest declares \(sha256.prefix(12))…")
        }
    }
}

/// The cohort rule (docs/protocol.md §6).
public enum Cohort {
    public static func bucket(deviceID: String, salt: String) -> UInt32 {
        let digest = SHA256Hasher.digest(Data((salt + ":" + deviceID).utf8))
        let first = digest.prefix(4).reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        return first % 10000
    }

    public static func contains(deviceID: String, salt: String, percent: Double) -> Bool {
        guard let points = Percent.basisPoints(percent) else { return false }
        return Int(bucket(deviceID: deviceID, salt: salt)) < points
    }
}

/// One tier's rules (docs/protocol.md §5); unset rules always hold.
public struct TierRules: Sendable, Equatable {
    public var minRamMB: Int64?
    public var minCPUCores: Int64?
    public var socAllow: [String]?
    public var os: [String]?

    public init(minRamMB: Int64? = nil, minCPUCores: Int64? = nil, socAllow: [String]? = nil, os: [String]? = nil) {
        self.minRamMB = minRamMB
        self.minCPUCores = minCPUCores
        self.socAllow = socAllow
        self.os = os
    }

    /// From the JSON of `[tiers]` (models.toml's keys); nil when a rule has the wrong type.
    public init?(json: JSONValue) {
        guard let o = json.objectValue else { return nil }
        if let v = o["min_ram_mb"], !v.isNull { guard let i = v.intValue, i >= 0 else { return nil }; minRamMB = i }
        if let v = o["min_cpu_cores"], !v.isNull { guard let i = v.intValue, i >= 1 else { return nil }; minCPUCores = i }
        if let v = o["soc_allow"], !v.isNull {
            guard let list = v.arrayValue?.compactMap(\.stringValue), list.count == v.arrayValue?.count else { return nil }
            socAllow = list
        }
        if let v = o["os"], !v.isNull {
            guard let list = v.arrayValue?.compactMap(\.stringValue), list.count == v.arrayValue?.count,
                list.allSatisfy({ $0 == "android" || $0 == "ios" })
            else { return nil }
            os = list
        }
    }

    /// Each rule the device misses, as a phrase; empty when it is in the tier.
    public func unmet(_ device: DeviceFacts) -> [String] {
        var out: [String] = []
        if let min = minRamMB, (device.ramMB ?? 0) < min { out.append("needs \(min) MB RAM, has \(device.ramMB ?? 0)") }
        if let min = minCPUCores, (device.cpuCores ?? 0) < min { out.append("needs \(min) cores, has \(device.cpuCores ?? 0)") }
        if let allow = socAllow, !(device.soc.map { soc in allow.contains { Tiers.socMatches($0, soc) } } ?? false) {
            out.append("needs a SoC in \(allow.joined(separator: ", ")), has \(device.soc ?? "none")")
        }
        if let oses = os, !(device.os.map { oses.contains($0) } ?? false) {
            out.append("needs OS \(oses.joined(separator: " or ")), has \(device.os ?? "none")")
        }
        return out
    }
}

public enum Tiers {
    public static let maxFileBytes = 64 * 1024
    public static let maxTiers = 64

    /// The tier file `edgereg tiers` exports (docs/protocol.md §5): `{"schema_version": 1,
    /// "tiers": [{"name", "rules"}, ...]}`, best first; nil when it is not one (an object of
    /// tiers, whose key order means nothing; an unknown or null rule; a name twice; a last tier
    /// that is not a catch-all). A build-time asset: nil is a bug the app's tests catch.
    public static func parse(_ data: Data) -> [(String, TierRules)]? {
        guard data.count <= maxFileBytes, let doc = try? StrictJSON.parse(data), let o = doc.objectValue,
            o["schema_version"]?.intValue == 1,
            o.keys.allSatisfy({ $0 == "schema_version" || $0 == "tiers" }),
            let listed = o["tiers"]?.arrayValue, (1...maxTiers).contains(listed.count)
        else { return nil }
        var out: [(String, TierRules)] = []
        for item in listed {
            guard let tier = item.objectValue, tier.count == 2, let name = tier["name"]?.stringValue, Fields.isName(name),
                !out.contains(where: { $0.0 == name }), let rules = tier["rules"]?.objectValue,
                rules.keys.allSatisfy({ ["min_ram_mb", "min_cpu_cores", "soc_allow", "os"].contains($0) }),
                rules.keys.allSatisfy({ !(rules[$0]!.isNull) }),
                let parsed = TierRules(json: .object(rules))
            else { return nil }
            if let n = parsed.minRamMB, n > 9_007_199_254_740_991 { return nil }
            if let n = parsed.minCPUCores, n > 9_007_199_254_740_991 { return nil }
            out.append((name, parsed))
        }
        let last = out[out.count - 1].1
        guard last.minRamMB == nil, last.minCPUCores == nil, last.socAllow == nil, last.os == nil else { return nil }
        return out
    }

    /// `*` any run (also none), `?` exactly one, everything else itself; case-insensitive.
    public static func socMatches(_ pattern: String, _ soc: String) -> Bool {
        let p = Array(pattern.lowercased().unicodeScalars), s = Array(soc.lowercased().unicodeScalars)
        // Iterative wildcard match with one backtrack point: linear in practice, no recursion.
        var pi = 0, si = 0, star = -1, mark = 0
        while si < s.count {
            if pi < p.count, p[pi] == "?" || (p[pi] != "*" && p[pi] == s[si]) {
                pi += 1
                si += 1
            } else if pi < p.count, p[pi] == "*" {
                star = pi
                mark = si
                pi += 1
            } else if star >= 0 {
                pi = star + 1
                mark += 1
                si = mark
            } else {
                return false
            }
        }
        while pi < p.count, p[pi] == "*" { pi += 1 }
        return pi == p.count
    }

    /// The first tier (best first) whose every rule holds, and why, or nil when none does.
    public static func resolve(_ tiers: [(String, TierRules)], _ device: DeviceFacts) -> (tier: String, reason: String)? {
        var why: [String] = []
        for (name, rules) in tiers {
            let unmet = rules.unmet(device)
            if unmet.isEmpty {
                var met: [String] = []
                if let v = rules.minRamMB { met.append("\(device.ramMB ?? 0) MB RAM >= \(v)") }
                if let v = rules.minCPUCores { met.append("\(device.cpuCores ?? 0) cores >= \(v)") }
                if rules.socAllow != nil { met.append("SoC \(device.soc ?? "") allowed") }
                if rules.os != nil { met.append("OS \(device.os ?? "")") }
                why.append("tier \(name): " + (met.isEmpty ? "the catch-all tier" : met.joined(separator: ", ")))
                return (name, why.joined(separator: "; "))
            }
            why.append("not \(name): " + unmet.joined(separator: "; "))
        }
        return nil
    }
}

/// What a device says about itself: tier, cohort, fit and reports use it.
public struct DeviceFacts: Sendable, Equatable {
    public var deviceID: String
    public var ramMB: Int64?
    public var cpuCores: Int64?
    public var soc: String?
    public var os: String?
    public var osVersion: String?
    public var mnnRuntime: String?
    public var appVersion: String?
    /// The CPU features for fit rule (e) (`dotprod`, `fp16`, `i8mm`, `bf16`, `sve2`, `sme`):
    /// read from the platform by default (`CPUFeatures.detected`), or said by the app (a test,
    /// a simulator); nil does not say them (rule (e) skipped). Reports carry only the class.
    public var cpuFeatures: Set<String>?
    /// How much memory one model (a bundle: its members together) may take here, MiB;
    /// nil (the default) skips fit rule (d).
    public var memoryBudgetMB: Double?

    public init(deviceID: String, ramMB: Int64? = nil, cpuCores: Int64? = nil, soc: String? = nil, os: String? = nil,
                osVersion: String? = nil, mnnRuntime: String? = nil, appVersion: String? = nil,
                cpuFeatures: Set<String>? = CPUFeatures.detected, memoryBudgetMB: Double? = nil) {
        self.deviceID = deviceID
        self.ramMB = ramMB
        self.cpuCores = cpuCores
        self.soc = soc
        self.os = os
        self.osVersion = osVersion
        self.mnnRuntime = mnnRuntime
        self.appVersion = appVersion
        self.cpuFeatures = cpuFeatures
        self.memoryBudgetMB = memoryBudgetMB
    }

    /// Why these facts cannot be used (a feature name no manifest could name, a budget that is
    /// not above 0 and at most 1048576 MiB), or nil. A client with such facts resolves no tier.
    public var problem: String? {
        if let bad = cpuFeatures?.sorted().first(where: { !Fields.isCPUFeature($0) }) {
            return "cpu feature '\(bad)' is not a feature name: a lowercase letter or digit, then up to 31 lowercase letters, digits, '_' or '-' (like i8mm)"
        }
        if let mb = memoryBudgetMB, !(mb > 0 && mb <= Fields.maxMemoryMB) {
            return "memory budget \(mb) MiB is not above 0 and at most 1048576"
        }
        return nil
    }

    var appFacts: AppFacts {
        AppFacts(mnnRuntime: mnnRuntime, appVersion: appVersion, os: os, osVersion: osVersion, cpuFeatures: cpuFeatures,
                 memoryBudgetMB: memoryBudgetMB)
    }
}
