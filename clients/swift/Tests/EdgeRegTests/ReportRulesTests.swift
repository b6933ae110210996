import Foundation
import Testing

@testable import EdgeReg

/// The reports of docs/protocol.md §11 against a collector over real HTTP: every rollout period
/// for both arms (refused releases too), the latency of the model that ran, reports kept until
/// delivered, device facts that never stop a report, one at a time in order from any task.
@Suite(.serialized) struct ReportRulesTests {
    func client(_ f: Fixture, device: String = "device-1", cache: String? = nil, osVersion: String = "17.2",
                mnnRuntime: String = "3.6.1", deviceClass: String? = "ram8-6c", selfTest: Bool = false,
                runner: (any ModelRunner)? = nil, maxStarts: Int = 3, policy: DownloadPolicy = DownloadPolicy()) -> EdgeRegClient {
        EdgeRegClient(ClientConfiguration(
            registry: f.server.url, trustedKeys: f.registry.trusted,
            cacheDirectory: cache.map { f.dir.appendingPathComponent($0) } ?? f.cache,
            device: DeviceFacts(deviceID: device, ramMB: 8192, cpuCores: 6, os: "ios", osVersion: osVersion, mnnRuntime: mnnRuntime,
                                appVersion: "2.4.0", cpuFeatures: nil),
            tier: "high", runner: runner, selfTest: selfTest, policy: policy, limits: Limits(timeout: 10, deadline: 60),
            reporting: true, deviceClass: deviceClass, maxUnconfirmedStarts: maxStarts))
    }

    /// The reports the collector accepted, in arrival order, each valid by the schema.
    func delivered(_ f: Fixture) throws -> [JSONValue] {
        for body in f.server.reports { #expect(ReportSchema.refusal(body) == nil, "\(String(decoding: body, as: UTF8.self))") }
        return try f.server.reports.map { try StrictJSON.parse($0) }
    }

    /// `version@sequence`, ` reverted`, and the count of calls it carries (or nil).
    func line(_ r: JSONValue) -> String {
        let count = r["inference"]?["count"]?.intValue.map(String.init) ?? "nil"
        let reverted = r["reverted"]?.boolValue == true ? " reverted" : ""
        return "\(r["version"]?.stringValue ?? "?")@\(r["sequence"]?.intValue ?? 0)\(reverted) \(count)"
    }

    @Test func theStableArmReportsAgainOnceInEachNewSequenceWithTheLatencySinceItsLastReport() async throws {
        let f = try Fixture()
        let outside = deviceID(inside: false, percent: 50)
        let v1 = try f.registry.entry("digits", "1.0.0"), v2 = try f.registry.entry("digits", "1.1.0")
        try f.registry.publish("digits", stable: v1, sequence: 5, reportURL: "v1/reports")
        let c = client(f, device: outside)
        #expect(await c.update(digits).ok)
        #expect(await c.confirm(digits, version: "1.0.0"))
        await c.recordInference(digits, ms: 12.5)
        #expect(await c.update(digits).notModified)
        try f.registry.publish("digits", stable: v1, candidate: v2, percent: 50, sequence: 6, reportURL: "v1/reports")
        #expect(await c.update(digits).version == "1.0.0")
        #expect(await c.update(digits).notModified, "a 304 sends none")
        try f.registry.publish("digits", stable: v1, candidate: v2, percent: 50, sequence: 7, reportURL: "v1/reports")
        #expect(await c.update(digits).ok)
        _ = await c.update(digits)
        _ = await c.flushReports()
        let r = try delivered(f)
        #expect(r.map(line) == ["1.0.0@5 nil", "1.0.0@5 nil", "1.0.0@6 1", "1.0.0@7 nil"])
        #expect(r.allSatisfy { $0["arm"]?.stringValue == "stable" && $0["token"] == r[0]["token"] }, "one install, one token")
        #expect(r[2]["confirmed"]?.boolValue == true, "kept, not reset")
    }

    @Test func aCandidateDeviceReportsAgainInItsArmAndNothingForAReleaseNotInstalledYet() async throws {
        let f = try Fixture()
        let inside = deviceID(inside: true, percent: 50)
        let v1 = try f.registry.entry("digits", "1.0.0"), v2 = try f.registry.entry("digits", "1.1.0")
        try f.registry.publish("digits", stable: v1, sequence: 5, reportURL: "v1/reports")
        let c = client(f, device: inside, policy: DownloadPolicy(allowMetered: false))
        let wifi = Conditions(metered: false)  // a condition nobody said is unmet: say the network
        #expect(await c.update(digits, conditions: wifi).ok)
        try f.registry.publish("digits", stable: v1, candidate: v2, percent: 50, sequence: 6, reportURL: "v1/reports")
        #expect(await c.update(digits, conditions: Conditions(metered: true)).deferred == "metered")
        #expect(await c.update(digits, conditions: wifi).version == "1.1.0")
        try f.registry.publish("digits", stable: v1, candidate: v2, percent: 60, sequence: 7, reportURL: "v1/reports")
        #expect(await c.update(digits, conditions: wifi).ok)
        _ = await c.flushReports()
        let r = try delivered(f)
        #expect(r.map(line) == ["1.0.0@5 nil", "1.1.0@6 nil", "1.1.0@7 nil"])
        #expect(r[2]["arm"]?.stringValue == "candidate" && r[2]["token"] == r[1]["token"])
    }

    @Test func aRejectedCandidateIsReportedInEachPeriodUnderItsOwnTokenWithoutLatency() async throws {
        let f = try Fixture()
        let inside = deviceID(inside: true, percent: 50)
        let v1 = try f.registry.entry("digits", "1.0.0", probe: FakeRunner.probe())
        let v2 = try f.registry.entry("digits", "1.1.0", probe: FakeRunner.probe())
        try f.registry.publish("digits", stable: v1, sequence: 5, reportURL: "v1/reports")
        #expect(await client(f, device: inside, selfTest: true, runner: FakeRunner()).update(digits).ok)
        let faulty = client(f, device: inside, selfTest: true, runner: FakeRunner(faulty: ["opencl", "cpu"]))
        try f.registry.publish("digits", stable: v1, candidate: v2, percent: 50, sequence: 6, reportURL: "v1/reports")
        #expect(await faulty.update(digits).errorCode == "probe-failed")
        await faulty.recordInference(digits, ms: 7)  // 1.0.0 runs these calls
        try f.registry.publish("digits", stable: v1, candidate: v2, percent: 60, sequence: 7, reportURL: "v1/reports")
        let r7 = await faulty.update(digits)
        #expect(r7.fallback == "bad-release" && r7.version == "1.0.0")
        #expect(await faulty.confirm(digits, version: "1.0.0"))
        _ = await faulty.flushReports()
        let r = try delivered(f)
        #expect(r.map(line) == ["1.0.0@5 nil", "1.1.0@6 nil", "1.1.0@7 nil", "1.0.0@5 1"])
        #expect(r[1]["probe"]?.stringValue == "failed" && r[2]["probe"]?.stringValue == "failed")
        #expect(r[2]["arm"]?.stringValue == "candidate" && r[2]["token"] == r[1]["token"], "the refusal's own token")
        #expect(r[3]["token"] == r[0]["token"], "the calls went to the release that ran them")
    }

    @Test func aRevertedCandidateIsReportedInEachPeriodWithNoneOfTheFallbacksLatency() async throws {
        let f = try Fixture()
        let inside = deviceID(inside: true, percent: 50)
        let v1 = try f.registry.entry("digits", "1.0.0"), v2 = try f.registry.entry("digits", "1.1.0")
        try f.registry.publish("digits", stable: v1, sequence: 5, reportURL: "v1/reports")
        let c = client(f, device: inside, maxStarts: 1)
        #expect(await c.update(digits).ok)
        #expect(await c.confirm(digits, version: "1.0.0"))
        try f.registry.publish("digits", stable: v1, candidate: v2, percent: 50, sequence: 6, reportURL: "v1/reports")
        #expect(await c.update(digits).version == "1.1.0")
        await c.recordInference(digits, ms: 30)  // 1.1.0 ran before appStarted: that start runs it
        #expect(await c.appStarted(digits).reverted == false)
        await c.recordInference(digits, ms: 31)  // 1.1.0 again, then the app crashed
        // The next start counts the one that crashed (1, reported with both calls), then reverts.
        #expect(await c.appStarted(digits).reverted == true)
        await c.recordInference(digits, ms: 9)  // the fallback, 1.0.0
        try f.registry.publish("digits", stable: v1, candidate: v2, percent: 60, sequence: 7, reportURL: "v1/reports")
        #expect(await c.update(digits).version == "1.0.0")
        await c.recordMemory(digits, peakMB: 100)  // 1.0.0's report goes again, with its calls
        _ = await c.flushReports()
        let r = try delivered(f)
        #expect(r.map(line) == ["1.0.0@5 nil", "1.0.0@5 nil", "1.1.0@6 nil", "1.1.0@6 2", "1.1.0@6 reverted nil",
                                "1.1.0@7 reverted nil", "1.0.0@5 1"])
        #expect(r[5]["arm"]?.stringValue == "candidate" && r[5]["token"] == r[2]["token"])
        #expect(r[6]["token"] == r[0]["token"] && r[6]["inference"]?["p50_ms"]?.doubleValue == 9)
    }

    @Test func aReportMadeOfflineWaitsForTheNetworkAcrossARestart() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0"), reportURL: "v1/reports")
        f.server.setOffline(true)
        let c = client(f)
        #expect(await c.update(digits).ok)
        for _ in 0..<3 {
            _ = await c.update(digits)
            _ = await c.flushReports()
        }
        let restarted = client(f)
        for _ in 0..<4 {
            _ = await restarted.update(digits)
            _ = await restarted.flushReports()
        }
        #expect(f.server.postCount >= 6, "tried at the update checks: more than five tries, none answered")
        #expect(f.server.reports.isEmpty)
        f.server.setOffline(false)
        _ = await restarted.update(digits)
        #expect(await restarted.flushReports() == 1)
        #expect(try delivered(f).map(line) == ["1.0.0@1 nil"], "a try with no answer does not count")
        let posts = f.server.postCount
        _ = await restarted.update(digits)
        _ = await restarted.flushReports()
        #expect(f.server.postCount == posts, "delivered: never sent again")
    }

    @Test func fiveAnswered5xxDropAReportAndAnyOther4xxAtOnce() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0"), reportURL: "v1/reports")
        f.server.answerPosts([503, 429, 0, 408, 500, 502])  // one unanswered: 5 counted in 6
        let c = client(f)
        #expect(await c.update(digits).ok)
        for _ in 0..<8 {
            _ = await c.flushReports()
            _ = await c.update(digits)
        }
        _ = await c.flushReports()
        #expect(f.server.postCount == 6, "dropped after the fifth answered failure")
        f.server.answerPosts([400])
        #expect(await c.confirm(digits))
        for _ in 0..<3 {
            _ = await c.flushReports()
            _ = await c.update(digits)
        }
        _ = await c.flushReports()
        #expect(f.server.postCount == 7, "a 400 is refused again: dropped at once")
        #expect(f.server.reports.isEmpty)
    }

    @Test func aNewerReportOfTheSameInstallReplacesOneNotDelivered() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0"), reportURL: "v1/reports")
        f.server.answerPosts([503, 503])
        let c = client(f)
        #expect(await c.update(digits).ok)
        _ = await c.flushReports()
        #expect(await c.confirm(digits, version: "1.0.0"))
        for _ in 0..<3 {
            _ = await c.flushReports()
            _ = await c.update(digits)
        }
        _ = await c.flushReports()
        let r = try delivered(f)
        #expect(r.count == 1 && r.first?["confirmed"]?.boolValue == true, "the install's report, replaced, is not sent again")
    }

    @Test func atMostSixteenWaitTheOldestDropped() async throws {
        let f = try Fixture()
        f.server.setOffline(true)  // offline: tries do not count
        let c = client(f)
        for i in 0..<17 {
            try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.\(i)", size: 1000), reportURL: "v1/reports")
            #expect(await c.update(digits).version == "1.0.\(i)")
            _ = await c.flushReports()
        }
        f.server.setOffline(false)
        _ = await c.update(digits)
        _ = await c.flushReports()
        let versions = try delivered(f).compactMap { $0["version"]?.stringValue }.sorted()
        #expect(versions == (1..<17).map { "1.0.\($0)" }.sorted(), "1.0.0's report, the oldest, was dropped for the sixteen newer")
    }

    @Test func aFactThePatternRefusesIsSentAsNullNeverASkippedReport() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0"), reportURL: "v1/reports")
        let cases: [(String, String, String)] = [
            ("17.2 (Sonoma, a long build name here)", "ram/8", "3.6.1 (1234)"),
            ("17.2\n", String(repeating: "r", count: 33), "v3.7.0-beta.1"),
            ("17.2", "ram8-6c", "3.6.1+local.5"),
            ("17.4 (21E219)", "ram8-6c", "3.6.1"),  // a version of §7's grammar: one grammar
        ]
        for (i, (os, deviceClass, mnn)) in cases.enumerated() {
            let c = client(f, device: "d\(i)", cache: "facts-\(i)", osVersion: os, mnnRuntime: mnn, deviceClass: deviceClass)
            let r = await c.update(digits)
            #expect(r.ok, "\(i): \(r.error ?? "")")
            _ = await c.flushReports()
        }
        let r = try delivered(f)
        #expect(r.count == 4, "every report sent")
        func facts(_ x: JSONValue) -> [String?] { [x["os_version"]?.stringValue, x["device_class"]?.stringValue, x["mnn_runtime"]?.stringValue] }
        #expect(r.map(facts) == [[nil, nil, "3.6.1 (1234)"], [nil, nil, "v3.7.0-beta.1"], ["17.2", "ram8-6c", "3.6.1+local.5"],
                              ["17.4 (21E219)", "ram8-6c", "3.6.1"]])
    }

    @Test func reportsFromManyTasksGoOneAtATimeInTheOrderMade() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0"), reportURL: "v1/reports")
        let c = client(f)
        #expect(await c.update(digits).ok)
        _ = await c.flushReports()
        f.server.delayPosts(20_000)  // each report still in flight when the next is made
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<4 {
                group.addTask {
                    for i in 0..<10 {
                        await c.recordInference(digits, ms: Double(i))
                        await c.recordMemory(digits, peakMB: nil, steadyMB: Double(i))
                    }
                }
            }
            group.addTask {
                for i in 1...10 { await c.recordMemory(digits, peakMB: Double(i)) }  // in this task's order
            }
        }
        _ = await c.flushReports()
        var peaks: [Double] = []
        for x in try delivered(f) {
            if let p = x["memory_peak_mb"]?.doubleValue, peaks.last != p { peaks.append(p) }
        }
        #expect(peaks == (1...10).map(Double.init), "arrived in the order made")
        #expect(f.server.reports.count == 1 + 40 + 10)
    }

    @Test func aReportsFileOfTheEarlierSDKStillConfirmsUnderTheInstallsToken() async throws {
        let f = try Fixture()
        try f.registry.publish("digits", stable: try f.registry.entry("digits", "1.0.0"), reportURL: "v1/reports")
        f.server.answerPosts([503])
        #expect(await client(f).update(digits).ok)
        let file = f.cache.appendingPathComponent("reports.json")
        var now = try JSONDecoder().decode(Reporter.Saved.self, from: Data(contentsOf: file))
        for _ in 0..<100 where now.undelivered?.isEmpty ?? true {  // the 503 comes back in the background
            try await Task.sleep(nanoseconds: 50_000_000)
            now = try JSONDecoder().decode(Reporter.Saved.self, from: Data(contentsOf: file))
        }
        // As SDK 0.2 wrote it: the latest report per unit/model, and one waiting for a retry.
        let made = try #require(now.reports?["digits/digits/1.0.0"])
        let old = Reporter.Saved(latest: ["digits/digits": Reporter.OldSaved(facts: made.facts, url: made.url)],
                                 retry: now.undelivered?.map { Reporter.Retry(body: $0.body, url: $0.url) })
        try JSONEncoder().encode(old).write(to: file)
        let upgraded = client(f)
        _ = await upgraded.update(digits)
        _ = await upgraded.flushReports()
        #expect(await upgraded.confirm(digits, version: "1.0.0"))
        _ = await upgraded.flushReports()
        let r = try delivered(f)
        #expect(r.map { $0["confirmed"]?.boolValue } == [false, true], "the waiting one at the update check, then the confirmation")
        #expect(r.count == 2 && r[0]["token"] == r[1]["token"])
    }
}
