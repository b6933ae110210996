import Foundation

// Runtime trials and hints (docs/protocol.md §3, "Runtime trials and hints", and §11,
// "Runtime hints"; decision 0008): the try-set an entry offers and the rules that give a class
// of devices another thread count and backend order.

/// One setting of a try-set: a thread count on one backend.
public struct TrialSetting: Sendable, Equatable {
    public let threads: Int
    public let backend: String
}

/// An entry's `runtime_trials` as read: its id (compared, never recomputed), 1 to 8 distinct
/// settings, and the bounds with their defaults filled in; unknown keys dropped.
public struct RuntimeTrials: Sendable, Equatable {
    public let id: String
    public let settings: [TrialSetting]
    public let maxRunsPerSetting: Int
    public let maxTotalMs: Int

    init(_ value: JSONValue, _ path: String) throws(WireError) {
        let r = try Reader(value, path)
        id = try r.string("id")
        guard Fields.isHex(id, min: 8, max: 8) else { throw WireError("\(r.at("id")) is not a try-set id: expected 8 lowercase hex characters") }
        let list = try r.requiredList("settings")
        guard (1...8).contains(list.count) else { throw WireError("\(r.at("settings")) holds 1 to 8 settings, got \(list.count)") }
        var settings: [TrialSetting] = []
        for (i, item) in list.enumerated() {
            let s = try Reader(item, "\(r.at("settings"))[\(i)]")
            let threads = Int(try s.int("threads", min: 1, max: 16))
            let backend = try s.string("backend")
            guard knownBackends.contains(backend) else { throw WireError("\(s.at("backend")): unknown backend '\(backend)'") }
            let setting = TrialSetting(threads: threads, backend: backend)
            guard !settings.contains(setting) else { throw WireError("\(s.path): \(threads) threads on \(backend) is offered twice") }
            settings.append(setting)
        }
        self.settings = settings
        maxRunsPerSetting = r.optional("max_runs_per_setting") == nil ? 5 : Int(try r.int("max_runs_per_setting", min: 1, max: 20))
        maxTotalMs = r.optional("max_total_ms") == nil ? 2000 : Int(try r.int("max_total_ms", min: 1, max: 10000))
    }

    /// As the wire says it, defaults filled in.
    public var json: JSONValue {
        .object(JSONObject([
            ("id", .string(id)),
            ("settings", .array(settings.map { .object(JSONObject([("threads", .int($0.threads)), ("backend", .string($0.backend))])) })),
            ("max_runs_per_setting", .int(maxRunsPerSetting)), ("max_total_ms", .int(maxTotalMs)),
        ]))
    }
}

/// What a device knows of itself for the hint rules (§11); nil: not known.
public struct HintFacts: Sendable, Equatable {
    public var cpuClass: String?
    public var cores: Int?
    public var soc: String?

    public init(cpuClass: String? = nil, cores: Int? = nil, soc: String? = nil) {
        (self.cpuClass, self.cores, self.soc) = (cpuClass, cores, soc)
    }

    /// The SoC family as the platform names it (§11): iOS `hw.machine` cut to its family
    /// (`iPhone15,2` → `iPhone15`); nil elsewhere (Linux, macOS: not named).
    static let platformSoC: String? = {
        #if os(iOS) || os(tvOS) || os(watchOS) || os(visionOS)
        var size = 0
        guard sysctlbyname("hw.machine", nil, &size, nil, 0) == 0, size > 1 else { return nil }
        var bytes = [CChar](repeating: 0, count: size)
        guard sysctlbyname("hw.machine", &bytes, &size, nil, 0) == 0 else { return nil }
        let machine = String(cString: bytes)
        let family = String(machine.split(separator: ",", maxSplits: 1).first ?? "")
        return family.isEmpty ? nil : family
        #else
        return nil
        #endif
    }()
}

/// One rule of an entry's `runtime_hints`: a device class, its threads and backends, the share
/// of the class using it (by §6's cohort with the rule's own salt).
public struct HintRule: Sendable, Equatable {
    /// The match's known keys; nil when the rule does not name it.
    public let cpuClass: String?
    public let cores: Int?
    public let soc: String?
    /// Keys of the match this client does not know: a rule naming one never matches.
    public let unknownKeys: [String]
    public let threads: Int
    public let backends: [String]
    public let percent: Double
    public let salt: String

    init(_ value: JSONValue, _ path: String) throws(WireError) {
        let r = try Reader(value, path)
        let m = try Reader(try r.required("match"), r.at("match"))
        var cpuClass: String?, cores: Int?, soc: String?
        var unknown: [String] = []
        for key in m.object.keys {
            switch key {
            case "cpu_class":
                cpuClass = try m.optionalString(key)
                if let c = cpuClass, !HintRule.isCPUClass(c) {
                    throw WireError("\(m.at(key)) is not a CPU class: a lowercase letter or digit, then up to 31 lowercase letters, digits, '.', '_' or '-'")
                }
            case "cores":
                cores = m.optional(key) == nil ? nil : Int(try m.int(key, min: 1, max: 1024))
            case "soc":
                soc = try m.optionalString(key)
                if let s = soc, !HintRule.isSoC(s) {
                    throw WireError("\(m.at(key)) is not an SoC family: 1 to 64 printable ASCII characters, spaces only inside")
                }
            default:
                unknown.append(key)  // as the reference: named, even null, a key this client does not know
            }
        }
        (self.cpuClass, self.cores, self.soc, unknownKeys) = (cpuClass, cores, soc, unknown)
        let rt = try Reader(try r.required("runtime"), r.at("runtime"))
        threads = Int(try rt.int("threads", min: 1, max: 16))
        backends = try RuntimeHints.backendList(try rt.required("backends"), rt.at("backends"))
        percent = try Reader.number(try r.required("percent"), r.at("percent"))
        guard let points = Percent.basisPoints(percent), points > 0 else {
            throw WireError("\(r.at("percent")) must be greater than 0, at most 100, with at most two decimals")
        }
        salt = try r.string("salt")
        guard Fields.isSalt(salt) else { throw WireError("\(r.at("salt")) is not 8 to 64 lowercase hex") }
    }

    static func list(_ value: JSONValue, _ path: String) throws(WireError) -> [HintRule] {
        guard let list = value.arrayValue else { throw WireError("\(path) is a JSON \(value.kind), expected an array") }
        guard (1...32).contains(list.count) else { throw WireError("\(path) holds 1 to 32 rules, got \(list.count)") }
        var out: [HintRule] = []
        for (i, item) in list.enumerated() { out.append(try HintRule(item, "\(path)[\(i)]")) }
        return out
    }

    /// Whether every key the rule names equals the device's own (a fact it does not know never equals).
    public func matches(_ facts: HintFacts) -> Bool {
        guard unknownKeys.isEmpty else { return false }
        if let cpuClass, cpuClass != facts.cpuClass { return false }
        if let cores, cores != facts.cores { return false }
        if let soc, soc != facts.soc { return false }
        return true
    }

    /// `^[a-z0-9][a-z0-9._-]{0,31}$`
    static func isCPUClass(_ s: String) -> Bool {
        let b = Array(s.utf8)
        guard (1...32).contains(b.count), Fields.isLower(b[0]) || Fields.isDigit(b[0]) else { return false }
        return b.allSatisfy { Fields.isLower($0) || Fields.isDigit($0) || $0 == 46 || $0 == 95 || $0 == 45 }
    }

    /// `^[!-~]([ -~]{0,62}[!-~])?$`: printable ASCII, spaces only inside, 1 to 64 characters.
    static func isSoC(_ s: String) -> Bool {
        let b = Array(s.utf8)
        guard (1...64).contains(b.count), b.allSatisfy({ $0 >= 32 && $0 <= 126 }) else { return false }
        return b.first != 32 && b.last != 32
    }
}

/// The runtime a device uses for an entry, and the rules behind it (§11, "Runtime hints").
public struct RuntimeChoice: Sendable, Equatable {
    public let runtime: RuntimeHints
    /// The index of the rule whose threads and backends these are, or nil: the declared runtime.
    public let rule: Int?
    /// The index of the first rule that matched, or nil (outside its percent: `rule` nil, this set).
    public let matched: Int?

    /// The first rule whose every named key equals the device's fact decides alone: inside its
    /// cohort the device uses its threads and backends (the declared precision stays), outside
    /// it the declared runtime, and no later rule is read. No rule matches: the declared runtime.
    public init(entry: ModelEntry, facts: HintFacts, deviceID: String) {
        for (i, rule) in (entry.runtimeHints ?? []).enumerated() where rule.matches(facts) {
            guard Cohort.contains(deviceID: deviceID, salt: rule.salt, percent: rule.percent) else {
                (runtime, self.rule, matched) = (entry.runtime, nil, i)
                return
            }
            (runtime, self.rule, matched) = (RuntimeHints(threads: rule.threads, backends: rule.backends, precision: entry.runtime.precision), i, i)
            return
        }
        (runtime, rule, matched) = (entry.runtime, nil, nil)
    }
}
