import Foundation
import Testing

@testable import EdgeReg

/// App metrics (docs/protocol.md §3, "App metrics"; §11) through the whole client over real HTTP:
/// the installed release's declarations, counts per install kept across restarts and sent as
/// totals with every report (schema 3), the 12-hour resend, misuse thrown at the call site.
@Suite(.serialized) struct MetricsTests {
    static let declarations: JSONValue = .object(JSONObject([
        ("accepted", .object(JSONObject([("kind", .string("rate")), ("better", .string("higher"))]))),  // an unknown key: ignored
        ("confidence", .object(JSONObject([("kind", .string("distribution")), ("buckets", .array([.double(0.5), .double(0.7), .double(0.9)]))]))),
    ]))

    func entry(_ f: Fixture, _ version: String, metrics: Bool = true) throws -> JSONValue {
        var o = try f.registry.entry("digits", version).objectValue!
        if metrics { o["metrics"] = Self.declarations }
        return .object(o)
    }

    func client(_ f: Fixture, reporting: Bool = true, cpuFeatures: Set<String>? = [], cache: String? = nil) -> EdgeRegClient {
        f.client(reporting: reporting, cpuFeatures: cpuFeatures, cacheDirectory: cache)
    }

    /// The reports the collector accepted, in arrival order, each valid by the schema.
    func delivered(_ f: Fixture, _ c: EdgeRegClient) async throws -> [JSONValue] {
        _ = await c.flushReports()
        for body in f.server.reports { #expect(ReportSchema.refusal(body) == nil, "\(String(decoding: body, as: UTF8.self))") }
        return try f.server.reports.map { try StrictJSON.parse($0) }
    }

    func metrics(_ r: JSONValue?) -> String? { r?["metrics"].map(CanonicalJSON.string) }

    @Test func theCountsGoAsTotalsWithEveryReportOfTheInstallInSchemaVersion3() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try entry(f, "1.0.0"), reportURL: "v1/reports")
        let c = client(f)
        #expect(try c.record(digits, "accepted", success: true) == false, "nothing installed: nothing counted, no error")
        #expect(try c.observe(digits, "anything", 0.3) == false, "nothing installed: not even the name is checked")
        #expect(c.metrics(digits).isEmpty)
        #expect(await c.update(digits).ok)
        #expect(c.metrics(digits).keys.sorted() == ["accepted", "confidence"])
        #expect(c.metrics(digits)["confidence"]?.buckets == [0.5, 0.7, 0.9])
        var r = try await delivered(f, c)
        #expect(r.last?["schema_version"]?.intValue != 3 && metrics(r.last) == nil, "no count yet")

        #expect(try c.record(digits, "accepted", success: true))
        try c.record(digits, "accepted", success: false)
        try c.record(digits, "accepted", success: true)
        // (-inf, 0.5], (0.5, 0.7], (0.7, 0.9], (0.9, +inf): an edge falls in the bucket it closes.
        for v in [-3, 0.5, 0.50001, 0.7, 0.9, 0.95, 1e300] { #expect(try c.observe(digits, "confidence", v)) }
        #expect(await c.confirm(digits, version: "1.0.0"))
        r = try await delivered(f, c)
        #expect(r.last?["schema_version"]?.intValue == 3)
        #expect(metrics(r.last) == #"{"accepted":{"events":3,"successes":2},"confidence":{"counts":[2,2,1,2]}}"#)
        try c.record(digits, "accepted", success: true)
        await c.recordMemory(digits, peakMB: 200, steadyMB: 150)  // any later report carries the totals so far
        r = try await delivered(f, c)
        #expect(metrics(r.last) == #"{"accepted":{"events":4,"successes":3},"confidence":{"counts":[2,2,1,2]}}"#)
    }

    @Test func misuseIsThrownAtTheCallSiteAndNothingIsCounted() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try entry(f, "1.0.0"), reportURL: "v1/reports")
        let c = client(f)
        _ = await c.update(digits)
        #expect(throws: MetricError.self) { try c.record(digits, "retried", success: true) }
        do {
            try c.observe(digits, "accepted", 0.5)
            Issue.record("observe on a rate counted")
        } catch {
            #expect(error.problem == .otherKind && error.message.contains("is a rate: use record()"), "\(error)")
        }
        do {
            try c.record(digits, "retried", success: true)
        } catch {
            #expect(error.problem == .undeclared && error.message.contains("declares no app metric 'retried'"), "\(error)")
        }
        #expect(throws: MetricError.self) { try c.record(digits, "confidence", success: true) }
        #expect(throws: MetricError.self) { try c.observe(digits, "confidence", .nan) }
        #expect(throws: MetricError.self) { try c.observe(digits, "confidence", -.infinity) }
        #expect(await c.confirm(digits, version: "1.0.0"))
        #expect(metrics(try await delivered(f, c).last) == nil, "nothing was counted")
    }

    @Test func theCountsSurviveARestartAndANewInstallStartsAtZero() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try entry(f, "1.0.0"), reportURL: "v1/reports")
        let first = client(f)
        _ = await first.update(digits)
        try first.record(digits, "accepted", success: true)
        try first.observe(digits, "confidence", 0.6)
        let again = client(f)  // the app starts again (the first one's counts are written in the background)
        try again.record(digits, "accepted", success: false)
        #expect(await again.confirm(digits, version: "1.0.0"))
        #expect(metrics(try await delivered(f, again).last) == #"{"accepted":{"events":2,"successes":1},"confidence":{"counts":[0,1,0,0]}}"#)

        try f.registry.publish("digits", stable: try entry(f, "1.1.0"), reportURL: "v1/reports")
        #expect(await again.update(digits).version == "1.1.0")
        var r = try await delivered(f, again)
        #expect(r.last?["version"]?.stringValue == "1.1.0" && metrics(r.last) == nil, "a new install counts from zero")
        try again.record(digits, "accepted", success: true)
        #expect(await again.confirm(digits, version: "1.1.0"))
        r = try await delivered(f, again)
        #expect(metrics(r.last) == #"{"accepted":{"events":1,"successes":1}}"#)
    }

    @Test func countsThatChangedGoAgainAtTheFirstUpdateCheckTwelveHoursAfterTheLastReport() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try entry(f, "1.0.0"), reportURL: "v1/reports")
        let c = client(f)
        let start: Int64 = 1_900_000_000
        await c.setClock(start)
        _ = await c.update(digits)
        let made = try await delivered(f, c).count
        try c.record(digits, "accepted", success: true)
        await c.setClock(start + 12 * 3600 - 1)
        #expect(await c.update(digits).notModified)
        #expect(try await delivered(f, c).count == made, "not 12 hours yet")
        await c.setClock(start + 12 * 3600)
        #expect(await c.update(digits).notModified)
        let r = try await delivered(f, c)
        #expect(r.count == made + 1, "12 hours after the last report, with new counts")
        #expect(metrics(r.last) == #"{"accepted":{"events":1,"successes":1}}"#)
        await c.setClock(start + 30 * 3600)
        _ = await c.update(digits)
        #expect(try await delivered(f, c).count == made + 1, "nothing new counted: nothing sent")
    }

    @Test func aReleaseWithoutMetricsTakesNoneAndReportingOffCountsNothing() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try entry(f, "1.0.0", metrics: false), reportURL: "v1/reports")
        let c = client(f)
        _ = await c.update(digits)
        #expect(throws: MetricError.self) { try c.record(digits, "accepted", success: true) }
        try f.registry.publish("digits", stable: try entry(f, "1.0.0"), reportURL: "v1/reports")
        let off = client(f, reporting: false, cache: "off")
        _ = await off.update(digits)
        #expect(try off.record(digits, "accepted", success: true) == false, "reporting off: nothing counted")
        #expect(throws: MetricError.self) { try off.record(digits, "retried", success: true) }
    }

    @Test func aDeviceOnTheEntrysInsteadCountsTheEntrysMetrics() async throws {
        let f = try Fixture()
        var o = try entry(f, "1.0.0").objectValue!
        o["avoid_cpu"] = .array([.string("i8mm")])
        var instead = try f.registry.entry("digits-w", "1.0.0").objectValue!
        instead["variant"] = .string("int8w")
        o["instead"] = .object(instead)
        try f.registry.publish("digits", stable: .object(o), reportURL: "v1/reports")
        let c = client(f, cpuFeatures: ["i8mm"])
        #expect(await c.update(digits).model?.variant == "int8w")
        #expect(try c.record(digits, "accepted", success: true))
    }

    @Test func eachMembersReportOfABundleCarriesTheUnitsCounts() async throws {
        let f = try Fixture()
        var b = try f.registry.bundleEntry("1.0.0", members: ["det", "rec"]).objectValue!
        b["metrics"] = Self.declarations
        try f.registry.publish("ocr", stable: .object(b), reportURL: "v1/reports")
        let c = client(f)
        let ocr = ReleaseUnit.bundle("ocr")
        #expect(await c.update(ocr).ok)
        try c.record(ocr, "accepted", success: false)
        try c.observe(ocr, "confidence", 0.95)
        #expect(await c.confirm(ocr, version: "1.0.0"))
        let confirmed = try await delivered(f, c).suffix(2)
        #expect(confirmed.map { $0["model"]?.stringValue ?? "" }.sorted() == ["det", "rec"])
        for r in confirmed {
            #expect(r["confirmed"]?.boolValue == true)
            #expect(metrics(r) == #"{"accepted":{"events":1,"successes":0},"confidence":{"counts":[0,0,0,1]}}"#)
        }
    }

    @Test func countsFromManyTasksAreExact() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try entry(f, "1.0.0"), reportURL: "v1/reports")
        let c = client(f)
        _ = await c.update(digits)
        await withTaskGroup(of: Void.self) { group in
            for seed in 0..<8 {
                group.addTask {
                    for i in 0..<500 {
                        _ = try? c.record(digits, "accepted", success: (i + seed) % 2 == 0)
                        _ = try? c.observe(digits, "confidence", Double(i % 4) * 0.2 + 0.45)  // one per bucket
                    }
                }
            }
        }
        #expect(await c.confirm(digits, version: "1.0.0"))
        #expect(metrics(try await delivered(f, c).last)
            == #"{"accepted":{"events":4000,"successes":2000},"confidence":{"counts":[1000,1000,1000,1000]}}"#)
    }
}
