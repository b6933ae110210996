import Foundation
import Testing

@testable import EdgeReg

/// The repository's tests/vectors, found from this file's location.
let vectorsDir: URL = URL(fileURLWithPath: #filePath)
    .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("tests/vectors")

/// Every file under tests/vectors, recursively, as a path relative to it.
func allVectorFiles() -> [String] {
    guard let walker = FileManager.default.enumerator(atPath: vectorsDir.path) else { return [] }
    var out: [String] = []
    while let path = walker.nextObject() as? String {
        var isDir: ObjCBool = false
        if FileManager.default.fileExists(atPath: vectorsDir.appendingPathComponent(path).path, isDirectory: &isDir), !isDir.boolValue {
            out.append(path)
        }
    }
    return out.sorted()
}

func loadJSON(_ relative: String) throws -> JSONValue {
    try StrictJSON.parse(Data(contentsOf: vectorsDir.appendingPathComponent(relative)))
}

/// What this client makes of one vector file; a kind it does not know is a failure.
func runVector(_ relative: String) throws -> (expected: JSONValue, got: JSONValue)? {
    // Not vectors: the generator, the test keys and their README.
    if relative == "generate.py" || relative.hasPrefix("keys/") { return nil }
    guard relative.hasSuffix(".json") else { throw Conformance.HarnessError(unknown: relative) }
    let vector = try loadJSON(relative)
    if relative == "rules/tiers.json" {
        let tiers = try #require(Conformance.tiers(vector["tiers"] ?? .null))
        var got: [JSONValue] = [], expected: [JSONValue] = []
        for case_ in try #require(vector["cases"]?.arrayValue) {
            let d = try #require(case_["device"]?.objectValue)
            let device = DeviceFacts(
                deviceID: case_["name"]?.stringValue ?? "", ramMB: d["ram_mb"]?.intValue, cpuCores: d["cpu_cores"]?.intValue,
                soc: d["soc"]?.stringValue, os: d["os"]?.stringValue)
            got.append(Tiers.resolve(tiers, device).map { .string($0.tier) } ?? .null)
            expected.append(case_["tier"] ?? .null)
        }
        return (.array(expected), .array(got))
    }
    if relative == "rules/cohorts.json" {
        var got: [JSONValue] = [], expected: [JSONValue] = []
        for case_ in try #require(vector["cases"]?.arrayValue) {
            let salt = try #require(case_["salt"]?.stringValue), id = try #require(case_["device_id"]?.stringValue)
            expected.append(case_["bucket"] ?? .null)
            got.append(.int(Int64(Cohort.bucket(deviceID: id, salt: salt))))
            let inside = try #require(case_["in_cohort"]?.objectValue)
            for percent in inside.keys {
                expected.append(inside[percent]!)
                got.append(.bool(Cohort.contains(deviceID: id, salt: salt, percent: try #require(Double(percent)))))
            }
        }
        return (.array(expected), .array(got))
    }
    let input = try #require(vector["input"]), expected = try #require(vector["expected"])
    let stem = String(relative.split(separator: "/").last!.dropLast(5))
    #expect(vector["name"]?.stringValue == stem, "\(relative): name is not the file's stem")
    let folder = relative.contains("/") ? String(relative.split(separator: "/").first!) : ""
    switch folder {
    case "" where input["manifest"] != nil: return (expected, try Conformance.decide(input))
    case "blobs": return (expected, try Conformance.checkBlob(input))
    case "probes": return (expected, try Conformance.checkProbe(input))
    case "labels": return (expected, try Conformance.checkLabels(input))
    case "versions": return (expected, try Conformance.checkVersion(input))
    case "conditions": return (expected, try Conformance.checkConditions(input))
    case "selftest": return (expected, try Conformance.checkSelfTest(input))
    case "health": return (expected, try Conformance.checkHealth(input))
    case "metrics": return (expected, try Conformance.checkMetrics(input))
    case "tiers": return (expected, try Conformance.checkTierFile(input))
    case "hints": return (expected, try Conformance.checkHints(input))
    case "reports":
        // Matching `field` is recommended, not required (docs/protocol.md §9): compared when both say one.
        var got = try Conformance.checkReport(input)
        if expected["field"] == nil || expected["field"]?.isNull == true, var o = got.objectValue {
            o["field"] = expected["field"]
            got = .object(o)
        }
        return (expected, got)
    default: throw Conformance.HarnessError(unknown: relative)
    }
}

extension Conformance.HarnessError {
    init(unknown path: String) {
        self.init("tests/vectors/\(path) is a kind of vector this client does not know: teach it")
    }
}

@Suite struct Vectors {
    @Test func thereAreVectors() {
        let files = allVectorFiles()
        #expect(files.count >= 50, "found \(files.count) files under \(vectorsDir.path)")
        #expect(files.contains("valid-stable.json"))
        #expect(files.contains("blobs/blob-exact.json"))
    }

    @Test(arguments: allVectorFiles())
    func vector(_ relative: String) throws {
        guard let (expected, got) = try runVector(relative) else { return }
        #expect(CanonicalJSON.string(got) == CanonicalJSON.string(expected), "\(relative)")
    }
}
