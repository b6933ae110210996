import Foundation
import Testing

@testable import EdgeReg

/// CPU features read from `/proc/cpuinfo` (docs/protocol.md §7's table), one row per core design.
@Suite struct CPUFeatureTests {
    static let rows: [(name: String, cpuinfo: String, features: Set<String>?, cpuClass: String?)] = [
        ("cortex-a710", "processor\t: 0\nBogoMIPS\t: 48.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs sb paca pacg dcpodp sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint svei8mm svebf16 i8mm bf16 dgh bti\nCPU implementer\t: 0x41\n",
         ["dotprod", "fp16", "i8mm", "bf16", "sve2"], "armv9"),
        ("cortex-a76", "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp\n\nprocessor\t: 1\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp\n",
         ["dotprod", "fp16"], "armv8.2"),
        ("cortex-a53", "processor : 0\nFeatures : fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid\n", [], "armv8"),
        // big.LITTLE: the lines of every core are united.
        ("mixed", "Features\t: fp asimd\nFeatures\t: fp asimd asimddp i8mm\n", ["dotprod", "i8mm"], "armv9"),
        ("sme-only", "Features\t: fp asimd sme\n", ["sme"], "armv8"),
        ("no-features-line", "processor\t: 0\nflags\t\t: fpu vme sse sse2 avx2\n", nil, nil),
    ]

    @Test(arguments: rows.indices)
    func fromCPUInfo(_ i: Int) {
        let row = Self.rows[i]
        #expect(CPUFeatures.fromCPUInfo(row.cpuinfo) == row.features, "\(row.name)")
        // The class as an ARM device says it, whatever this host is.
        #expect(CPUFeatures.cpuClass(row.features, arch: "arm") == row.cpuClass, "\(row.name)")
    }

    @Test func classes() {
        #expect(CPUFeatures.cpuClass(nil) == nil, "features not said: no class")
        #expect(CPUFeatures.cpuClass([], arch: "x86_64") == "x86_64")
        #expect(CPUFeatures.cpuClass([], arch: "arm") == "armv8")
        #expect(CPUFeatures.cpuClass([], arch: "other") == "other")
        #expect(CPUFeatures.cpuClass(["sve2"], arch: "x86_64") == "armv9", "a simulated ARM device on an x86 host")
        #expect(CPUFeatures.cpuClass(["bf16"], arch: "x86_64") == "armv8")
        #expect(CPUFeatures.cpuClass(["fp16"], arch: "arm") == "armv8.2")
        #expect(CPUFeatures.cpuClass(["some-later-feature"], arch: "x86_64") == "x86_64")
    }

    @Test func thisHost() {
        #if arch(x86_64)
        #expect(CPUFeatures.detect() == [], "no ARM feature applies on x86_64: the empty set is said")
        #expect(DeviceFacts(deviceID: "d").cpuFeatures == [], "DeviceFacts reads the platform by default")
        #else
        #expect(CPUFeatures.detect() == CPUFeatures.detected)
        #endif
        #expect(DeviceFacts(deviceID: "d", cpuFeatures: nil).appFacts.cpuFeatures == nil)
    }

    @Test func factsAClientCannotUse() {
        #expect(DeviceFacts(deviceID: "d", cpuFeatures: ["I8MM"]).problem != nil)
        #expect(DeviceFacts(deviceID: "d", cpuFeatures: [""]).problem != nil)
        #expect(DeviceFacts(deviceID: "d", memoryBudgetMB: 0).problem != nil)
        #expect(DeviceFacts(deviceID: "d", memoryBudgetMB: .nan).problem != nil)
        #expect(DeviceFacts(deviceID: "d", memoryBudgetMB: 1_048_577).problem != nil)
        #expect(DeviceFacts(deviceID: "d", cpuFeatures: ["i8mm", "a-later_one"], memoryBudgetMB: 1_048_576).problem == nil)
        let client = EdgeRegClient(ClientConfiguration(
            registry: URL(string: "http://127.0.0.1:9/")!, trustedKeys: TrustedKeys(pems: [])!, cacheDirectory: temporaryDirectory(),
            device: DeviceFacts(deviceID: "d", memoryBudgetMB: -1), tier: "high"))
        #expect(client.tier == nil && client.tierReason.contains("memory budget"))
    }
}

extension TestRegistry {
    /// `entry` whose variant must not run on `avoid`, with the same version's `instead` variant.
    func avoiding(_ name: String, _ version: String, avoid: [String], peak: Double? = nil,
                  insteadPeak: Double? = nil, insteadAvoid: [String]? = nil) throws -> (entry: JSONValue, instead: JSONValue) {
        var instead = try entry("\(name)-fp32", version).objectValue!
        instead["variant"] = .string("fp32")
        if let insteadPeak { instead["peak_memory_mb"] = .double(insteadPeak) }
        if let insteadAvoid { instead["avoid_cpu"] = .array(insteadAvoid.map { .string($0) }) }
        var outer = try entry(name, version).objectValue!
        outer["avoid_cpu"] = .array(avoid.map { .string($0) })
        if let peak { outer["peak_memory_mb"] = .double(peak) }
        outer["instead"] = .object(instead)
        return (.object(outer), .object(instead))
    }
}

/// Fit rules (d) and (e) through the whole client, over real HTTP.
@Suite(.serialized) struct FitClientTests {
    @Test func aDeviceWithAnAvoidedFeatureInstallsTheInstead() async throws {
        let f = try Fixture()
        let (outer, instead) = try f.registry.avoiding("digits", "1.0.0", avoid: ["i8mm"])
        try f.registry.publish("digits", stable: outer)
        let cases: [(Set<String>?, JSONValue, String?)] = [
            (["dotprod", "fp16", "i8mm"], instead, "cpu-unsupported"),
            (["dotprod", "fp16"], outer, nil),
            ([], outer, nil),
            (nil, outer, nil),  // not said: rule (e) skipped
        ]
        for (i, (features, installed, substitute)) in cases.enumerated() {
            let client = f.client(cpuFeatures: features, cacheDirectory: "device-\(i)")
            let result = await client.update(digits)
            #expect(result.ok && result.updated, "\(String(describing: features)): \(result.error ?? "")")
            #expect(result.substitute == substitute, "\(String(describing: features))")
            #expect(result.model?.sha256 == installed["sha256"]?.stringValue, "\(String(describing: features))")
            #expect(result.model?.variant == installed["variant"]?.stringValue)
            #expect(result.version == "1.0.0")
            let path = try #require(result.path)
            #expect(SHA256Hasher.hex(try Data(contentsOf: path)) == installed["sha256"]?.stringValue)
            // Again: the same release, nothing downloaded, still the substitute.
            let again = await client.update(digits)
            #expect(again.ok && !again.updated && again.substitute == substitute && again.model?.sha256 == result.model?.sha256)
        }
    }

    @Test func anInsteadThatDoesNotFitRefusesAndKeepsTheLastGood() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "0.9.0"))
        let client = f.client(cpuFeatures: ["i8mm", "dotprod"], memoryBudgetMB: 512)
        #expect(await client.update(digits).version == "0.9.0")
        let (overMemory, _) = try f.registry.avoiding("digits", "1.0.0", avoid: ["i8mm"], insteadPeak: 600)
        try f.registry.publish("digits", stable: overMemory)
        let refused = await client.update(digits)
        #expect(refused.errorCode == "cpu-unsupported" && refused.version == "0.9.0")
        let (avoidsToo, _) = try f.registry.avoiding("digits", "1.0.0", avoid: ["i8mm"], insteadAvoid: ["dotprod"])
        try f.registry.publish("digits", stable: avoidsToo)
        #expect(await client.update(digits).errorCode == "cpu-unsupported")
        #expect(await client.current(digits).version == "0.9.0")
    }

    @Test func aCandidateRefusedHereFallsBackToStableAsItsInstead() async throws {
        let f = try Fixture()
        let (stable, instead) = try f.registry.avoiding("digits", "1.0.0", avoid: ["i8mm"])
        try f.registry.publish("digits", stable: stable, candidate: try f.registry.entry("digits", "1.1.0"), percent: 100)
        let client = f.client(cpuFeatures: ["i8mm"])
        let candidate = await client.update(digits)
        #expect(candidate.ok && candidate.isCandidate && candidate.substitute == nil)
        _ = await client.revert(digits, reason: "the app saw it misbehave")
        let result = await client.update(digits)
        #expect(result.ok && !result.isCandidate && result.fallback == "bad-release", "\(result.error ?? "")")
        #expect(result.substitute == "cpu-unsupported" && result.model?.sha256 == instead["sha256"]?.stringValue)
    }

    @Test func aReleaseOverTheMemoryBudgetIsRefusedAndACandidateFallsBack() async throws {
        let f = try Fixture()
        var heavy = try f.registry.entry("digits", "1.0.0").objectValue!
        heavy["peak_memory_mb"] = .double(900)
        try f.registry.publish("digits", stable: .object(heavy))
        let small = f.client(memoryBudgetMB: 512)
        let refused = await small.update(digits)
        #expect(refused.errorCode == "insufficient-memory" && refused.version == nil && refused.members.isEmpty)
        #expect(await f.client(memoryBudgetMB: 900, cacheDirectory: "equal").update(digits).version == "1.0.0", "equal fits")
        #expect(await f.client(memoryBudgetMB: nil, cacheDirectory: "unsaid").update(digits).version == "1.0.0", "not said: skipped")
        // A candidate over the budget: the device in the cohort gets stable.
        let f3 = try Fixture()
        var stable = try f3.registry.entry("digits", "1.0.0").objectValue!
        stable["peak_memory_mb"] = .double(300)
        var candidate = try f3.registry.entry("digits", "1.1.0").objectValue!
        candidate["peak_memory_mb"] = .double(700)
        try f3.registry.publish("digits", stable: .object(stable), candidate: .object(candidate), percent: 100)
        let fell = await f3.client(memoryBudgetMB: 512).update(digits)
        #expect(fell.ok && fell.version == "1.0.0" && !fell.isCandidate && fell.fallback == "insufficient-memory")
    }

    @Test func aBundleMemberIsSubstitutedAndTheSumUsesItsMemory() async throws {
        let f = try Fixture()
        var members = JSONObject()
        for name in ["cls", "det"] {
            var m = try f.registry.entry(name, "1.0.0").objectValue!
            m["peak_memory_mb"] = .double(100)
            members[name] = .object(m)
        }
        let (rec, recInstead) = try f.registry.avoiding("rec", "1.0.0", avoid: ["i8mm"], peak: 400, insteadPeak: 250)
        members["rec"] = rec
        try f.registry.publish("ocr", stable: .object(JSONObject([("version", .string("2.0.0")), ("members", .object(members))])))
        // 100 + 100 + 250 (the instead's) fits 450; the outer rec's 400 would not.
        let result = await f.client(cpuFeatures: ["i8mm"], memoryBudgetMB: 450).update(ocr)
        #expect(result.ok && result.substitute == "cpu-unsupported", "\(result.error ?? "")")
        #expect(result.members["rec"]?.sha256 == recInstead["sha256"]?.stringValue && result.members["rec"]?.variant == "fp32")
        #expect(result.members["cls"]?.variant == "int8" && result.version == "2.0.0")
        let over = await f.client(cpuFeatures: ["i8mm"], memoryBudgetMB: 449, cacheDirectory: "small").update(ocr)
        #expect(over.errorCode == "insufficient-memory" && over.members.isEmpty)
        // Without the avoided feature the outer rec counts: 100 + 100 + 400.
        #expect(await f.client(cpuFeatures: [], memoryBudgetMB: 599, cacheDirectory: "older").update(ocr).errorCode == "insufficient-memory")
        let plain = await f.client(cpuFeatures: [], memoryBudgetMB: 600, cacheDirectory: "plain").update(ocr)
        #expect(plain.ok && plain.substitute == nil && plain.members["rec"]?.sha256 == rec["sha256"]?.stringValue)
    }
}

/// Reports of schema_version 2 (docs/protocol.md §11–§12), delivered to a collector.
@Suite(.serialized) struct ReportsV2Tests {
    func parsed(_ f: Fixture) throws -> [JSONValue] {
        for body in f.server.reports { #expect(ReportSchema.refusal(body) == nil, "\(String(decoding: body, as: UTF8.self))") }
        return try f.server.reports.map { try StrictJSON.parse($0) }
    }

    @Test func aReportSettingNoVersion2KeyIsAVersion1Report() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0"), reportURL: "v1/reports")
        let client = f.client(reporting: true, cpuFeatures: nil)
        #expect(await client.update(digits).ok)
        await client.recordMemory(digits, peakMB: .nan)  // not a measurement: nothing is sent
        _ = await client.flushReports()
        let reports = try parsed(f)
        #expect(reports.count == 1)
        let o = try #require(reports.first?.objectValue)
        #expect(o["schema_version"]?.intValue == 1)
        #expect(o.keys.filter(ReportSchema.version2Keys.contains).isEmpty)
        #expect(o.keys.sorted() == [
            "arm", "backends_skipped", "confirmed", "load_failed", "mnn_runtime", "model", "os", "os_version", "probe", "reverted",
            "schema_version", "sequence", "tier", "token", "unit", "unit_version", "variant", "version",
        ])
    }

    @Test func crashLoopsMemoryFirstInferenceAndTheCPUClassAreReported() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0"), reportURL: "v1/reports")
        let client = f.client(reporting: true, cpuFeatures: ["dotprod", "fp16", "i8mm"])
        #expect(await client.update(digits).ok)
        _ = await client.flushReports()  // reports go out concurrently: flushed per step for their order
        // Installed before appStarted: this start runs it. Then two starts each count the one
        // before, which ended without a confirmation, and send the count (a crash loop shows early).
        #expect(await client.appStarted(digits).reverted == false)
        _ = await client.flushReports()
        #expect(await client.appStarted(digits).reverted == false)
        _ = await client.flushReports()
        #expect(await client.appStarted(digits).reverted == false)
        _ = await client.flushReports()
        var reports = try parsed(f)
        #expect(reports.map { $0["unconfirmed_starts"]?.intValue } == [nil, 1, 2])
        #expect(reports.allSatisfy { $0["schema_version"]?.intValue == 2 && $0["cpu_class"]?.stringValue == "armv9" })
        #expect(reports.allSatisfy { !(($0.objectValue?.keys ?? []).contains { $0.hasPrefix("cpu_f") }) }, "never the features")
        // The first real call after the install, then steady ones; the app measures its memory.
        await client.recordInference(digits, ms: 95.5)
        await client.recordInference(digits, ms: 12)
        await client.recordMemory(digits, peakMB: 212.5, steadyMB: 140)
        _ = await client.flushReports()
        await client.recordInference(digits, ms: 11)
        #expect(await client.confirm(digits, version: "1.0.0"))
        _ = await client.flushReports()
        // A restart: the install's later reports keep what was reported.
        let restarted = f.client(reporting: true, cpuFeatures: ["dotprod", "fp16", "i8mm"])
        await restarted.recordInference(digits, ms: 30)
        #expect(await restarted.appStarted(digits).reverted == false)  // confirmed: no count, no report
        await restarted.recordMemory(digits, peakMB: nil, steadyMB: 150)
        _ = await client.flushReports()
        _ = await restarted.flushReports()
        reports = try parsed(f)
        #expect(reports.count == 6)
        let memory = reports[3], confirmed = reports[4], later = reports[5]
        #expect(memory["memory_peak_mb"]?.doubleValue == 212.5 && memory["memory_steady_mb"]?.doubleValue == 140)
        #expect(memory["first_inference_ms"]?.doubleValue == 95.5, "the install's first recorded call")
        #expect(memory["inference"]?["count"]?.intValue == 2)
        #expect(confirmed["confirmed"]?.boolValue == true && confirmed["first_inference_ms"]?.doubleValue == 95.5)
        #expect(confirmed["memory_peak_mb"]?.doubleValue == 212.5 && confirmed["unconfirmed_starts"]?.intValue == 2)
        #expect(later["memory_steady_mb"]?.doubleValue == 150 && later["memory_peak_mb"]?.doubleValue == 212.5)
        #expect(later["first_inference_ms"]?.doubleValue == 95.5, "kept, not replaced by a later process's first call")
        #expect(Set(reports.compactMap { $0["token"]?.stringValue }).count == 1, "one install, one token")
    }

    @Test func aNewInstallStartsANewFirstInference() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0"), reportURL: "v1/reports")
        let client = f.client(reporting: true, cpuFeatures: nil)
        #expect(await client.update(digits).ok)
        _ = await client.flushReports()  // reports go out concurrently: flushed per step for their order
        await client.recordInference(digits, ms: 80)
        #expect(await client.confirm(digits))
        _ = await client.flushReports()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.1.0"), reportURL: "v1/reports")
        #expect(await client.update(digits).version == "1.1.0")
        _ = await client.flushReports()
        await client.recordInference(digits, ms: 70)
        #expect(await client.confirm(digits))
        _ = await client.flushReports()
        let reports = try parsed(f)
        #expect(reports.map { $0["first_inference_ms"]?.doubleValue } == [nil, 80, nil, 70])
        #expect(reports.map { $0["schema_version"]?.intValue } == [1, 2, 1, 2])
    }
}
