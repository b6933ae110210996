package dev.edgereg;

import dev.edgereg.internal.Cancel;
import dev.edgereg.internal.Codec;
import dev.edgereg.internal.Decision;
import dev.edgereg.internal.Ed25519;
import dev.edgereg.internal.HashPipe;
import dev.edgereg.internal.Http;
import dev.edgereg.internal.Json;
import dev.edgereg.internal.Probe;
import dev.edgereg.internal.Reasons;
import dev.edgereg.internal.Rejected;
import dev.edgereg.internal.Rules;
import dev.edgereg.internal.Store;
import dev.edgereg.internal.Wire;
import java.io.File;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * One unit (a model, or a bundle installed as one): fetch, verify, choose, download, self-test,
 * install (docs/protocol.md sections 7 to 11). Every method turns every failure into a result.
 */
final class Engine {
    static final int CHUNK = 64 * 1024;
    static final long MAX_LABELS_BYTES = dev.edgereg.internal.Labels.MAX_BYTES;

    final EdgeregClient client;
    final String unit;
    final boolean bundle;
    final String kind;
    final BundledRelease shipped;
    /** What the last self-test found per member: {backend, skipped list, load ms, probe outcome}. */
    private Map<String, Object[]> selfTestResults = new LinkedHashMap<String, Object[]>();
    private Map<String, List<String>> selfTestFailed = new LinkedHashMap<String, List<String>>();
    private final Map<String, Boolean> selfTestLoadFailed = new LinkedHashMap<String, Boolean>();
    /** The transport of the update in progress (its deadline covers every request). */
    private Http http;
    /** Cancels the update in progress (read by cancel() on any thread). */
    private volatile Cancel running;
    /** Told how the download of the update in progress goes, or null. */
    private ProgressListener progress;
    private long tallyDone;
    private long tallyTotal;

    Engine(EdgeregClient client, String unit, boolean bundle, BundledRelease shipped) {
        this.client = client;
        this.unit = unit;
        this.bundle = bundle;
        this.kind = bundle ? "bundles" : "models";
        this.shipped = shipped;
    }

    Store store() { return client.store; }

    // --- public operations ---------------------------------------------------------------

    /**
     * Held by everything that changes this unit (update, revert, app start, confirm). Reads take
     * no lock: every file is replaced atomically, so an app asking for current() while a Worker
     * downloads gets the installed set at once instead of waiting for the download.
     */
    private final java.util.concurrent.locks.ReentrantLock lock = new java.util.concurrent.locks.ReentrantLock();

    UpdateResult current() {
        try {
            // The shipped release is installed by whoever gets the lock first; an update in
            // progress has already done it.
            if (shipped != null && lock.tryLock()) {
                try {
                    installShippedOrRecord();
                } finally {
                    lock.unlock();
                }
            }
            Map<String, Object> installed = store().readInstalled(kind, unit);
            return installed == null ? empty(null, null) : result(installed, false, false, 0, null);
        } catch (Rejected r) {
            return empty(r.code, r.getMessage());
        } catch (RuntimeException e) {
            return empty(Reasons.INTERNAL, String.valueOf(e));
        }
    }

    UpdateResult update(DownloadPolicy.Conditions conditions) {
        return update(conditions, null, new Cancel());
    }

    /** One update; {@code token} cancels it from any thread (an interrupt of this thread too). */
    UpdateResult update(DownloadPolicy.Conditions conditions, ProgressListener listener, Cancel token) {
        token.runOn(Thread.currentThread());
        lock.lock();
        try {
            running = token;
            progress = listener;
            return updateLocked(conditions);
        } finally {
            http = null;
            running = null;
            progress = null;
            token.done();
            lock.unlock();
        }
    }

    /** Cancel the update in progress, if one runs (idempotent; any thread). */
    void cancel() {
        Cancel c = running;
        if (c != null) c.cancel();
    }

    /** Stop here when the app cancelled (before anything is switched). */
    private void checkpoint() throws Rejected {
        Cancel c = running;
        if (c != null) c.check();
    }

    private void tally(long add) {
        tallyDone += add;
        ProgressListener p = progress;
        if (p == null) return;
        try {
            p.onProgress(tallyDone, tallyTotal);
        } catch (RuntimeException e) {
            // the app's listener never breaks the download
        }
    }

    private UpdateResult updateLocked(DownloadPolicy.Conditions conditions) {
        Map<String, Object> installed = null;
        try {
            if (shipped != null) installShippedOrRecord();
            installed = store().readInstalled(kind, unit);
            client.reporter.retryPending();
            sendMetricsIfDue(installed);
            Http http = client.http();
            http.startDeadline();
            http.cancel = running;
            this.http = http; // one deadline for the manifest and every blob of this update
            UpdateResult r = fetch(http, installed, conditions);
            recordError(null, null);
            return r;
        } catch (Rejected r) {
            // A connection the app's cancel cut (the manifest's, a blob's) fails as transport: it is the cancel.
            if (running != null && running.isCancelled() && Reasons.TRANSPORT.equals(r.code)) r = Cancel.cancelled();
            recordError(r.code, r.getMessage());
            return failure(installed, r.code, r.getMessage());
        } catch (RuntimeException e) {
            recordError(Reasons.INTERNAL, String.valueOf(e));
            return failure(installed, Reasons.INTERNAL, String.valueOf(e));
        }
    }

    private UpdateResult failure(Map<String, Object> installed, String code, String message) {
        if (installed == null) return empty(code, message);
        try {
            return result(installed, false, false, 0, null).withError(code, message);
        } catch (RuntimeException e) {
            return empty(code, message);
        }
    }

    UpdateResult empty(String code, String message) {
        return new UpdateResult(unit, client.tier, null, false, false, false, null, null, null, false, 0, code, message, InstalledModel.none());
    }

    // --- fetch ----------------------------------------------------------------------------

    private UpdateResult fetch(Http http, Map<String, Object> installed, DownloadPolicy.Conditions conditions) throws Rejected {
        Object[] accepted = acceptManifest(http, true);
        checkpoint();
        return apply(avoidBad((Decision) accepted[0]), installed, conditions, (Boolean) accepted[1], null);
    }

    /**
     * Fetch and verify the manifest, store its sequence and bytes: {decision, was 304}. An update's
     * check ({@code reportingPeriod}) reports the rollout period (section 11); check() does not.
     */
    private Object[] acceptManifest(Http http, boolean reportingPeriod) throws Rejected {
        String tier = client.tier;
        Object[] state = store().readTierState(unit, tier);
        Long highest = store().readSequence(unit);
        byte[] cached = state == null ? null : (byte[]) state[0];
        String cachedEtag = state == null ? null : (String) state[1];
        String path = "manifests/" + unit + "/" + tier + ".json";
        Http.Response response = http.getManifest(path, cached != null ? cachedEtag : null);
        byte[] data;
        String etag;
        boolean notModified = false;
        try {
            if (response.status == 304 && cached != null) {
                data = cached;
                etag = response.etag != null ? response.etag : cachedEtag;
                notModified = true;
            } else if (response.status == 404) {
                throw new Rejected(Reasons.NOT_FOUND, "the registry has no manifest for '" + unit + "', tier '" + tier + "' ("
                        + response.url + " answered 404)");
            } else if (response.status != 200) {
                throw new Rejected(Reasons.TRANSPORT, response.url + " answered HTTP " + response.status + ", expected 200");
            } else {
                if (response.length != null && response.length > Decision.MAX_MANIFEST_BYTES) {
                    throw new Rejected(Reasons.MALFORMED, "manifest is " + response.length + " bytes, more than the limit of " + Decision.MAX_MANIFEST_BYTES);
                }
                data = readUpTo(response, Decision.MAX_MANIFEST_BYTES + 1);
                etag = response.etag;
            }
        } finally {
            response.close();
        }
        Decision decision = decide(data, highest, client.now(), true);
        // Rollback protection first, before anything is downloaded.
        if (highest == null || decision.sequence != highest) store().writeSequence(unit, decision.sequence);
        if (!notModified || (etag != null && !etag.equals(cachedEtag))) store().writeTierState(unit, tier, data, etag);
        if (reportingPeriod && !notModified) reportPeriod(decision);
        return new Object[] {decision, notModified};
    }

    /**
     * A new rollout period for the release this manifest gives the device, before its own
     * refusals: each member's report goes again with the new sequence and arm, whatever the
     * check does next (docs/protocol.md section 11, "Every rollout period, both arms").
     */
    private void reportPeriod(Decision decision) {
        if (decision.unit == null || decision.manifest.reportUrl == null) return;
        try {
            for (String name : decision.unit.members.keySet()) {
                client.reporter.period(decision.manifest.reportUrl, unit, name, decision.unit.version, decision.isCandidate, decision.manifest.sequence);
            }
        } catch (RuntimeException e) {
            // a report is never a reason to fail an update
        }
    }

    private static byte[] readUpTo(Http.Response response, int limit) throws Rejected {
        java.io.ByteArrayOutputStream out = new java.io.ByteArrayOutputStream();
        byte[] buf = new byte[8192];
        while (out.size() < limit) {
            int n = response.read(buf, 0, Math.min(buf.length, limit - out.size()));
            if (n < 0) break;
            out.write(buf, 0, n);
        }
        return out.toByteArray();
    }

    private Decision decide(byte[] data, Long highest, long now, boolean checkExpiry) throws Rejected {
        Ed25519 ed = client.ed25519;
        return Decision.decide(data, client.trusted, ed, unit, client.tier, bundle, client.device.deviceId,
                appFacts(), highest, now, checkExpiry);
    }

    private Decision.AppFacts appFacts() {
        DeviceFacts d = client.device;
        // Fit rule (f): the MNN APIs of the app's runner, when the self-test has one.
        java.util.Set<String> apis = client.selfTest && client.runner != null ? client.runner.mnnApis() : null;
        return new Decision.AppFacts(d.mnnRuntime, d.appVersion, d.os, d.osVersion, d.cpuFeatures, d.memoryBudgetMb, apis);
    }

    /** A release this device refused for good counts as not fitting (section 8, bad releases). */
    private Decision avoidBad(Decision decision) throws Rejected {
        if (decision.unit == null) return decision;
        Map<String, Object> bad = store().readBad(unit);
        if (!bad.containsKey(decision.unit.version)) return decision;
        Wire.Unit stable = decision.manifest.stableUnit;
        Decision.Fit fitted = decision.isCandidate && stable != null && !bad.containsKey(stable.version) ? Decision.fit(stable, appFacts()) : null;
        if (fitted != null && fitted.misfit == null) {
            return new Decision(decision.manifest, fitted.unit, false, decision.sequence, Reasons.BAD_RELEASE, fitted.substitute);
        }
        throw new Rejected(Reasons.BAD_RELEASE, unit + " " + decision.unit.version + " was refused on this device before ("
                + bad.get(decision.unit.version) + "); it is not installed again");
    }

    // --- install ---------------------------------------------------------------------------

    private Map<String, Object> memberRecord(Wire.Entry e) {
        Map<String, Object> m = new LinkedHashMap<String, Object>();
        m.put("version", e.version);
        m.put("variant", e.variant);
        m.put("sha256", e.blob.sha256);
        m.put("size", e.blob.size);
        m.put("min_mnn_runtime", e.minMnnRuntime);
        // The runtime this device uses (section 11, "Runtime hints"): applied at every verified
        // manifest, so a rule changed without a new blob reaches the installed release.
        Rules.RuntimeChoice choice = Rules.chooseRuntime(e, client.hintFacts, client.device.deviceId);
        Map<String, Object> runtime = new LinkedHashMap<String, Object>();
        runtime.put("threads", (long) choice.threads);
        runtime.put("backends", new ArrayList<Object>(choice.backends));
        runtime.put("precision", choice.precision);
        m.put("runtime", runtime);
        m.put("runtime_rule", choice.rule == null ? Json.NULL : (Object) (long) choice.rule);
        m.put("contract", e.contract == null ? Json.NULL : e.contract);
        m.put("probe_sha256", e.probe == null ? Json.NULL : e.probe.sha256);
        m.put("labels_sha256", e.labelsBlob == null ? Json.NULL : e.labelsBlob.sha256);
        m.put("backend", Json.NULL);
        return m;
    }

    @SuppressWarnings("unchecked")
    private static boolean sameRelease(Map<String, Object> a, Map<String, Object> b) {
        if (!String.valueOf(a.get("version")).equals(String.valueOf(b.get("version")))) return false;
        Map<String, Object> ma = (Map<String, Object>) a.get("members");
        Map<String, Object> mb = (Map<String, Object>) b.get("members");
        if (ma == null || mb == null || !ma.keySet().equals(mb.keySet())) return false;
        for (String k : ma.keySet()) {
            Object sa = ((Map<String, Object>) ma.get(k)).get("sha256");
            Object sb = ((Map<String, Object>) mb.get(k)).get("sha256");
            if (sa == null || !sa.equals(sb)) return false;
        }
        return true;
    }

    @SuppressWarnings("unchecked")
    private UpdateResult apply(Decision decision, Map<String, Object> installed, DownloadPolicy.Conditions conditions,
            boolean notModified, BundledRelease fromApp) throws Rejected {
        Wire.Unit chosen = decision.unit;
        if (chosen == null) {
            setPending(null, null, null);
            // As the reference client: nothing new for this device (a withdrawn model, a canary
            // outside the cohort); what is installed stays and current() returns it.
            return new UpdateResult(unit, client.tier, null, false, false, notModified, null, null, null, false, 0, null, null, InstalledModel.none());
        }
        Map<String, Object> fresh = new LinkedHashMap<String, Object>();
        fresh.put("version", chosen.version);
        fresh.put("tier", client.tier);
        fresh.put("is_candidate", decision.isCandidate);
        fresh.put("sequence", decision.manifest.sequence);
        fresh.put("bundled", fromApp != null);
        fresh.put("report_url", decision.manifest.reportUrl == null ? Json.NULL : decision.manifest.reportUrl);
        // The app metrics it declares (an instead's are its entry's): what record() and observe() take.
        if (chosen.metrics != null) fresh.put("metrics", Wire.Metric.toJson(chosen.metrics));
        Map<String, Object> members = new TreeMap<String, Object>();
        for (Map.Entry<String, Wire.Entry> e : chosen.members.entrySet()) members.put(e.getKey(), memberRecord(e.getValue()));
        fresh.put("members", members);
        if (installed != null && sameRelease(fresh, installed)) {
            Map<String, Object> kept = new LinkedHashMap<String, Object>(fresh);
            Map<String, Object> oldMembers = (Map<String, Object>) installed.get("members");
            for (String name : members.keySet()) {
                ((Map<String, Object>) members.get(name)).put("backend", ((Map<String, Object>) oldMembers.get(name)).get("backend"));
            }
            kept.put("previous", installed.containsKey("previous") ? installed.get("previous") : Json.NULL);
            kept.put("bundled", Boolean.TRUE.equals(installed.get("bundled")) && fromApp != null);
            if (installed.get("token") != null) kept.put("token", installed.get("token"));
            if (!Json.canonicalString(kept).equals(Json.canonicalString(installed))) store().writeInstalled(kind, unit, kept);
            setPending(null, null, null);
            return result(kept, false, notModified, 0, decision);
        }
        for (Map.Entry<String, Wire.Entry> e : chosen.members.entrySet()) {
            Wire.BlobRef labels = e.getValue().labelsBlob;
            if (labels != null && labels.size > MAX_LABELS_BYTES) {
                // Refused before any byte (docs/protocol.md section 8).
                throw new Rejected(Reasons.MALFORMED, "the labels blob of " + e.getKey() + " declares " + labels.size + " bytes, more than " + MAX_LABELS_BYTES);
            }
            Wire.BlobRef data = e.getValue().probeData;
            if (data != null && data.size > Probe.MAX_DATA_BYTES) {
                // Refused before any byte (docs/protocol.md section 11).
                throw new Rejected(Reasons.MALFORMED, "the probe data of " + e.getKey() + " declares " + data.size + " bytes, more than " + Probe.MAX_DATA_BYTES);
            }
        }
        List<Wire.BlobRef> missing = new ArrayList<Wire.BlobRef>();
        for (Wire.Entry e : chosen.members.values()) {
            for (Wire.BlobRef ref : e.blobs()) {
                if (!store().hasBlob(ref.sha256, ref.size) && !contains(missing, ref)) missing.add(ref);
            }
        }
        long downloaded = 0;
        if (!missing.isEmpty()) {
            if (fromApp == null) {
                String deferred = client.policy.unmet(conditions);
                setPending(fresh, missing, deferred);
                if (deferred != null) {
                    if (installed == null) {
                        return new UpdateResult(unit, client.tier, null, false, false, notModified, null, null, deferred, false, 0, null, null,
                                InstalledModel.none());
                    }
                    UpdateResult r = result(installed, false, notModified, 0, null);
                    return new UpdateResult(r.unit, r.tier, r.version, r.isCandidate, false, notModified, null, null, deferred, r.bundled, 0,
                            null, null, r.members);
                }
            }
            preflight(missing);
            tallyTotal = 0;
            tallyDone = 0;
            long kept = 0;
            for (Wire.BlobRef ref : missing) {
                tallyTotal += ref.size;
                File part = store().part(ref.sha256);
                kept += part.isFile() ? Math.min(ref.size, part.length()) : 0;
            }
            if (fromApp == null) tally(kept); // the total before the first byte
            // The digests follow the files on a second thread: a blob's is awaited after the
            // last blob is down (or as soon as it is done), never between reads.
            HashPipe hashes = new HashPipe();
            try {
                List<Download> pending = new ArrayList<Download>();
                for (Wire.BlobRef ref : missing) {
                    checkpoint();
                    if (fromApp == null) {
                        Download d = download(ref, hashes);
                        downloaded += d.transferred;
                        pending.add(d);
                        installHashed(hashes, pending, false); // a bad blob hashed by now stops the rest
                    } else {
                        copyShipped(ref, fromApp);
                    }
                }
                installHashed(hashes, pending, true);
            } finally {
                hashes.close();
            }
        }
        for (Map.Entry<String, Wire.Entry> e : chosen.members.entrySet()) labelsOf(e.getKey(), e.getValue()); // a bad labels blob refuses the release
        String token = client.reporter.enabled() ? Reporter.newToken() : null;
        checkpoint();
        try {
            selfTest(chosen, members);
        } catch (Rejected r) {
            if (Reasons.PROBE_NOT_RUN.equals(r.code)) throw r; // no verdict: still pending, nothing reported
            setPending(null, null, null);
            if (r.permanent) store().markBad(unit, chosen.version, r.code + ": " + r.getMessage());
            reportRejected(token, fresh, chosen, decision);
            throw r;
        }
        if (installed != null) {
            Map<String, Object> previous = new LinkedHashMap<String, Object>(installed);
            previous.remove("previous");
            fresh.put("previous", previous);
        } else {
            fresh.put("previous", Json.NULL);
        }
        if (token != null) fresh.put("token", token);
        checkpoint(); // the last moment a cancel counts: the switch is next
        store().writeInstalled(kind, unit, fresh);
        setPending(null, null, null);
        store().evict();
        client.health.installed(unit, chosen.version, started);
        reportInstalled(token, fresh, chosen, decision);
        String before = installed == null ? null : (String) installed.get("version");
        boolean lower = before != null && dev.edgereg.internal.Versions.compareSemver(chosen.version, before) < 0;
        client.notifyChange(new ModelChange(unit, lower ? ModelChange.ROLLED_BACK : ModelChange.INSTALLED, chosen.version, before));
        return result(fresh, true, notModified, downloaded, decision);
    }

    private static boolean contains(List<Wire.BlobRef> refs, Wire.BlobRef ref) {
        for (Wire.BlobRef r : refs) if (r.sha256.equals(ref.sha256)) return true;
        return false;
    }

    private void preflight(List<Wire.BlobRef> missing) throws Rejected {
        long remaining = 0;
        for (Wire.BlobRef ref : missing) {
            File part = store().part(ref.sha256);
            long have = part.isFile() ? part.length() : 0;
            remaining += Math.max(0, ref.size - have);
        }
        long free = client.freeSpace();
        long needed = remaining + client.policy.reserveBytes;
        if (free < needed) {
            throw new Rejected(Reasons.NO_SPACE, "the download needs " + needed + " bytes (" + remaining + " to fetch and a reserve of "
                    + client.policy.reserveBytes + ") and " + store().root + " has " + free + " free; nothing was downloaded");
        }
    }

    /** A blob downloaded into its .part: installed once its digest (hashed behind) matches. */
    private static final class Download {
        final Wire.BlobRef ref;
        final File part;
        final Decision.BlobCheck check;
        final HashPipe.Job hashing; // null: the digest holds every byte already
        final long transferred;

        Download(Wire.BlobRef ref, File part, Decision.BlobCheck check, HashPipe.Job hashing, long transferred) {
            this.ref = ref;
            this.part = part;
            this.check = check;
            this.hashing = hashing;
            this.transferred = transferred;
        }
    }

    /** Download a blob into its .part, its digest following on {@code hashes}' thread. */
    private Download download(Wire.BlobRef ref, HashPipe hashes) throws Rejected {
        File part = store().part(ref.sha256);
        File dir = part.getParentFile();
        if (!dir.isDirectory() && !dir.mkdirs()) throw new Rejected(Reasons.CACHE, "cannot create " + dir);
        Decision.BlobCheck check = new Decision.BlobCheck(ref);
        long have = resumeFrom(part, check);
        if (check.remaining() == 0) return new Download(ref, part, check, null, 0);
        long[] transferred = {0};
        HashPipe.Job job = transfer(ref, part, check, have, hashes, transferred);
        return new Download(ref, part, check, job, transferred[0]);
    }

    /**
     * Verify and move into the cache each pending blob whose digest is complete ({@code all}:
     * waiting for every one, a cancel still stopping the wait within a tenth of a second).
     */
    private void installHashed(HashPipe hashes, List<Download> pending, boolean all) throws Rejected {
        for (java.util.Iterator<Download> it = pending.iterator(); it.hasNext();) {
            Download d = it.next();
            if (d.hashing != null) {
                if (!all && !d.hashing.finished()) continue;
                try {
                    while (!await(hashes, d.hashing)) checkpoint();
                } catch (IOException e) {
                    throw new Rejected(Reasons.CACHE, "cannot read " + d.part + ": " + e.getMessage(), e);
                }
            }
            it.remove();
            try {
                d.check.finish();
            } catch (Rejected r) {
                d.part.delete();
                throw r;
            }
            // The digest read the bytes written, not what the path holds now: a part cut or grown
            // since (by anything but this download) is not the blob hashed.
            if (!d.part.isFile() || d.part.length() != d.ref.size) {
                long held = d.part.length();
                d.part.delete();
                throw new Rejected(Reasons.CACHE, d.part + " holds " + held + " bytes, not the " + d.ref.size + " downloaded and hashed: it changed under the download");
            }
            if (!d.part.renameTo(store().blob(d.ref.sha256))) throw new Rejected(Reasons.CACHE, "cannot install " + d.part);
        }
    }

    private static boolean await(HashPipe hashes, HashPipe.Job job) throws IOException, Rejected {
        try {
            return hashes.await(job, 100);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt(); // an interrupt of the updating thread cancels
            throw Cancel.cancelled();
        }
    }

    private long resumeFrom(File part, Decision.BlobCheck check) throws Rejected {
        if (!part.isFile()) return 0;
        long size = part.length();
        if (size > check.blob.size) {
            part.delete();
            return 0;
        }
        try {
            InputStream in = new FileInputStream(part);
            try {
                byte[] buf = new byte[CHUNK];
                int n;
                while ((n = in.read(buf)) > 0) check.update(buf, 0, n);
            } finally {
                in.close();
            }
        } catch (IOException e) {
            throw new Rejected(Reasons.CACHE, "cannot read " + part + ": " + e.getMessage(), e);
        }
        return size;
    }

    private HashPipe.Job transfer(Wire.BlobRef ref, File part, Decision.BlobCheck check, long have, HashPipe hashes, long[] transferred)
            throws Rejected {
        Http.Response response;
        try {
            response = http.get(ref.path, null, have);
        } catch (Rejected r) {
            if (running != null && running.isCancelled()) throw Cancel.cancelled();
            throw r;
        }
        final Http.Response[] open = {response};
        Runnable abort = new Runnable() {
            @Override public void run() {
                open[0].abort();
            }
        };
        if (running != null) running.watch(abort);
        try {
            boolean append = have > 0;
            if (have > 0 && !(response.status == 206 && response.rangeStart != null && response.rangeStart == have)) {
                // The server ignored the Range (200, the whole body) or refused it: start again.
                part.delete();
                check.reset();
                tally(-have);
                append = false;
                if (response.status != 200) {
                    response.close();
                    response = http.get(ref.path, null, 0);
                    open[0] = response;
                }
            }
            if (!(response.status == 200 || (response.status == 206 && response.rangeStart != null && response.rangeStart == check.received()))) {
                throw new Rejected(Reasons.TRANSPORT, response.url + " answered HTTP " + response.status + ", expected 200");
            }
            check.expect(response.length);
            return stream(response, part, check, append ? have : 0, hashes, transferred);
        } catch (Rejected r) {
            // Cut by the app's cancel: cancelled, and the part stays for a resume.
            if (running != null && running.isCancelled()) throw Cancel.cancelled();
            if (!Reasons.TRANSPORT.equals(r.code)) part.delete();
            throw r;
        } finally {
            if (running != null) running.unwatch(abort);
            open[0].close();
        }
    }

    private HashPipe.Job stream(Http.Response response, File part, Decision.BlobCheck check, long from, HashPipe hashes, long[] transferred)
            throws Rejected {
        FileOutputStream out;
        try {
            out = new FileOutputStream(part, from > 0);
        } catch (IOException e) {
            throw new Rejected(Reasons.CACHE, "cannot write " + part + ": " + e.getMessage(), e);
        }
        // The digest reads the file behind this thread (HashPipe): this one reads and writes.
        HashPipe.Job job = hashes.add(check.digest(), part, from);
        try {
            byte[] buf = new byte[CHUNK];
            while (check.remaining() > 0) {
                // At most one byte past the declared size is ever read.
                int n = response.read(buf, 0, (int) Math.min(buf.length, check.remaining()));
                if (n < 0) throw check.endedEarly(response.length, response.url);
                check.count(n);
                transferred[0] += n;
                try {
                    out.write(buf, 0, n);
                } catch (IOException e) {
                    closeQuietly(out);
                    part.delete(); // free the space: the app needs it more than a resume
                    throw new Rejected(Reasons.CACHE, "cannot write " + part + ": " + e.getMessage(), e);
                }
                job.wrote(n);
                tally(n);
                checkpoint();
            }
            byte[] one = new byte[1];
            if (response.read(one, 0, 1) > 0) check.count(1); // anything more is blob-too-large
            try {
                out.flush();
                out.getFD().sync();
            } catch (IOException e) {
                throw new Rejected(Reasons.CACHE, "cannot write " + part + ": " + e.getMessage(), e);
            }
        } finally {
            job.closed();
            closeQuietly(out);
        }
        return job;
    }

    private static void closeQuietly(java.io.Closeable c) {
        try {
            c.close();
        } catch (IOException e) {
            // already failing or done
        }
    }

    private void copyShipped(Wire.BlobRef ref, BundledRelease fromApp) throws Rejected {
        File part = store().part(ref.sha256);
        part.getParentFile().mkdirs();
        Decision.BlobCheck check = new Decision.BlobCheck(ref);
        InputStream in = null;
        try {
            in = fromApp.openBlob(ref.sha256);
            if (in == null) throw new Rejected(Reasons.MALFORMED, "the shipped release has no blob " + ref.sha256.substring(0, 12));
            FileOutputStream out = new FileOutputStream(part, false);
            try {
                byte[] buf = new byte[CHUNK];
                int n;
                while ((n = in.read(buf)) > 0) {
                    check.update(buf, 0, n);
                    out.write(buf, 0, n);
                }
                out.flush();
                out.getFD().sync();
            } finally {
                out.close();
            }
            check.finish();
            if (!part.renameTo(store().blob(ref.sha256))) throw new IOException("cannot rename " + part);
        } catch (Rejected r) {
            part.delete();
            throw r;
        } catch (IOException e) {
            part.delete();
            throw new Rejected(Reasons.CACHE, "cannot copy the shipped blob " + ref.sha256.substring(0, 12) + ": " + e.getMessage(), e);
        } finally {
            if (in != null) closeQuietly(in);
        }
    }

    private List<String> labelsOf(String name, Wire.Entry e) throws Rejected {
        if (e.labels != null) return e.labels;
        if (e.labelsBlob == null) return null;
        return readLabels(name, e.labelsBlob.sha256, e.labelsBlob.size);
    }

    List<String> readLabels(String name, String sha, long size) throws Rejected {
        if (size > MAX_LABELS_BYTES) throw new Rejected(Reasons.MALFORMED, "the labels blob of " + name + " is " + size + " bytes, more than " + MAX_LABELS_BYTES);
        try {
            return dev.edgereg.internal.Labels.parse(Store.readAll(store().blob(sha), MAX_LABELS_BYTES), name);
        } catch (IOException e) {
            throw new Rejected(Reasons.CACHE, "cannot read the labels of " + name + ": " + e.getMessage(), e);
        }
    }

    // --- self-test ------------------------------------------------------------------------------

    @SuppressWarnings("unchecked")
    private void selfTest(Wire.Unit chosen, Map<String, Object> members) throws Rejected {
        selfTestResults = new LinkedHashMap<String, Object[]>();
        selfTestFailed = new LinkedHashMap<String, List<String>>();
        if (!client.selfTest) return;
        for (Map.Entry<String, Wire.Entry> e : chosen.members.entrySet()) {
            Wire.Entry entry = e.getValue();
            Probe probe = null;
            if (entry.probe != null) {
                try {
                    Wire.BlobRef data = entry.probeData;
                    byte[] tensors = data == null ? null : Store.readAll(store().blob(data.sha256), data.size);
                    probe = Probe.parse(Store.readAll(store().blob(entry.probe.sha256), entry.probe.size), entry.blob.sha256,
                            data == null ? null : data.sha256, tensors);
                } catch (IOException x) {
                    throw new Rejected(Reasons.CACHE, "cannot read the probe of " + e.getKey() + ": " + x.getMessage(), x);
                }
            }
            SelfTest.Outcome outcome = new SelfTest(client, e.getKey(), entry, store().blob(entry.blob.sha256), probe).run();
            if (outcome.notRun) {
                throw new Rejected(Reasons.PROBE_NOT_RUN, e.getKey() + " " + entry.version + ": the self-test could not run the probe on this device ("
                        + outcome.why + "); nothing is marked bad, the next update tries again");
            }
            if (outcome.backend == null) {
                selfTestFailed.put(e.getKey(), outcome.skipped);
                selfTestLoadFailed.put(e.getKey(), outcome.loadFailed);
                throw new Rejected(Reasons.PROBE_FAILED, e.getKey() + " " + entry.version + " (variant " + entry.variant
                        + ") failed its self-test on every backend: " + outcome.why, true);
            }
            selfTestResults.put(e.getKey(), new Object[] {outcome.backend, outcome.skipped, outcome.loadMs, probe == null ? "none" : "passed"});
            ((Map<String, Object>) members.get(e.getKey())).put("backend", outcome.backend);
        }
    }

    // --- reports ---------------------------------------------------------------------------------

    @SuppressWarnings("unchecked")
    private void reportInstalled(String token, Map<String, Object> record, Wire.Unit chosen, Decision decision) {
        if (token == null || decision.manifest.reportUrl == null) return;
        for (Map.Entry<String, Wire.Entry> e : chosen.members.entrySet()) {
            Object[] st = selfTestResults.get(e.getKey());
            Wire.Entry entry = e.getValue();
            Map<String, Object> r = client.reporter.report(token, unit, e.getKey(), entry.version, chosen.version, entry.variant, client.tier,
                    decision.isCandidate, decision.manifest.sequence, st == null ? "none" : (String) st[3], st == null ? null : (String) st[0],
                    st == null ? new ArrayList<String>() : (List<String>) st[1], st == null || st[2] == null ? null : Math.round((Double) st[2] * 1000.0) / 1000.0, false);
            client.reporter.installed(decision.manifest.reportUrl, r, true);
        }
    }

    private void reportRejected(String token, Map<String, Object> record, Wire.Unit chosen, Decision decision) {
        if (token == null || decision.manifest.reportUrl == null) return;
        for (Map.Entry<String, List<String>> f : selfTestFailed.entrySet()) {
            Wire.Entry entry = chosen.members.get(f.getKey());
            Map<String, Object> r = client.reporter.report(token, unit, f.getKey(), entry.version, chosen.version, entry.variant, client.tier,
                    decision.isCandidate, decision.manifest.sequence, "failed", null, f.getValue(), null, Boolean.TRUE.equals(selfTestLoadFailed.get(f.getKey())));
            client.reporter.installed(decision.manifest.reportUrl, r, false);
        }
    }

    // --- app metrics (docs/protocol.md section 3, "App metrics"; section 11) ---------------------

    /** The installed release's version, report token and declared metrics, as of one write of the install records. */
    private static final class Declared {
        final long generation;
        final String version;
        final String token;
        final Map<String, AppMetric> metrics;

        Declared(long generation, Map<String, Object> record) {
            this.generation = generation;
            this.version = record == null ? null : Health.str(record.get("version"));
            this.token = record == null ? null : Health.str(record.get("token"));
            this.metrics = AppMetric.fromJson(record == null ? null : record.get("metrics"));
        }
    }

    /** Read again only after this client wrote installed.json: counting never waits for the disk twice. */
    private volatile Declared declared;

    private Declared declared() throws Rejected {
        long generation = store().generation();
        Declared d = declared;
        if (d == null || d.generation != generation) {
            d = new Declared(generation, store().readInstalled(kind, unit));
            declared = d;
        }
        return d;
    }

    Map<String, AppMetric> declaredMetrics() {
        try {
            return declared().metrics;
        } catch (Rejected | RuntimeException e) {
            return new LinkedHashMap<String, AppMetric>();
        }
    }

    /**
     * Count an outcome of the installed release's app metric: a rate's ({@code value} 1 when it
     * succeeded) or a distribution's {@code observed} value. False when nothing is installed.
     *
     * @throws IllegalArgumentException the release declares no such metric of that kind
     */
    boolean count(String metric, boolean rate, int value, double observed) {
        Declared d;
        try {
            d = declared();
        } catch (Rejected | RuntimeException e) {
            return false; // a cache beyond reading: nothing counted, never a crash
        }
        if (d.version == null) return false; // nothing installed: nothing counted
        AppMetric m = d.metrics.get(metric);
        String call = rate ? "record" : "observe";
        String why = AppMetric.refusal(d.metrics, metric, rate, rate ? 0 : observed);
        if ("undeclared".equals(why) || m == null) {
            throw new IllegalArgumentException(call + "(\"" + metric + "\"): " + unit + " " + d.version + " declares no app metric '" + metric
                    + "' (declared: " + (d.metrics.isEmpty() ? "none" : String.valueOf(d.metrics.keySet())) + "); declare it in models.toml ["
                    + kind + "." + unit + ".metrics." + metric + "]");
        }
        if ("other-kind".equals(why)) {
            throw new IllegalArgumentException(call + "(\"" + metric + "\"): app metric '" + metric + "' of " + unit + " " + d.version + " is a "
                    + m.kind + ": use " + (m.isRate() ? "record" : "observe") + "()");
        }
        return client.reporter.count(d.token, m, rate ? value : m.bucket(observed));
    }

    /** Counts changed since the install's last report, 12 hours ago or more: its reports go again now (docs/protocol.md section 11). */
    @SuppressWarnings("unchecked")
    private void sendMetricsIfDue(Map<String, Object> installed) {
        if (installed == null || !client.reporter.metricsDue(Health.str(installed.get("token")))) return;
        for (String name : ((Map<String, Object>) installed.get("members")).keySet()) client.reporter.summary(unit, name);
    }

    // --- shipped release --------------------------------------------------------------------------

    private void installShippedOrRecord() {
        try {
            installShipped();
        } catch (Rejected r) {
            recordError(r.code, "shipped release: " + r.getMessage());
        } catch (IOException e) {
            recordError(Reasons.CACHE, "shipped release: " + e.getMessage());
        }
    }

    private void installShipped() throws Rejected, IOException {
        byte[] data = shipped.manifest();
        // Once a manifest was accepted online, no shipped copy is installed again: a shipped
        // one would otherwise replace the online release at each start (docs/protocol.md section 10).
        if (store().readSequence(unit) != null) return;
        Map<String, Object> installed = store().readInstalled(kind, unit);
        // Verified like a fetched manifest except its expiry (docs/protocol.md section 10).
        Decision probe = decide(data, null, client.now(), false);
        long seq = probe.manifest.sequence;
        // Only above an earlier shipped copy (an app update).
        if (installed != null && seq <= Health.num(installed.get("sequence"))) return;
        Decision decision = avoidBad(probe);
        // The highest sequence is not written: a shipped manifest signed with 2^53 - 1 by mistake
        // would make every later online manifest a rollback, on every device, for good.
        if (decision.unit == null) return;
        apply(decision, installed, DownloadPolicy.Conditions.unknown(), false, shipped);
    }

    // --- status bookkeeping ---------------------------------------------------------------------

    private void setPending(Map<String, Object> fresh, List<Wire.BlobRef> missing, String deferred) throws Rejected {
        Map<String, Object> status = store().readStatus(unit);
        if (fresh == null) {
            if (status.get("pending") == null || status.get("pending") == Json.NULL) return;
            status.put("pending", Json.NULL);
        } else {
            Object old = status.get("pending");
            String since = old instanceof Map && fresh.get("version").equals(((Map<?, ?>) old).get("version"))
                    ? String.valueOf(((Map<?, ?>) old).get("since")) : Codec.formatTime(client.now());
            Map<String, Object> p = new LinkedHashMap<String, Object>();
            p.put("version", fresh.get("version"));
            p.put("is_candidate", fresh.get("is_candidate"));
            List<Object> blobs = new ArrayList<Object>();
            for (Wire.BlobRef ref : missing) {
                Map<String, Object> b = new LinkedHashMap<String, Object>();
                b.put("sha256", ref.sha256);
                b.put("size", ref.size);
                blobs.add(b);
            }
            p.put("blobs", blobs);
            p.put("deferred", deferred == null ? Json.NULL : deferred);
            p.put("since", since);
            status.put("pending", p);
        }
        store().writeStatus(unit, status);
    }

    void recordError(String code, String message) {
        try {
            Map<String, Object> status = store().readStatus(unit);
            if (code == null) {
                if (status.get("last_error") == null || status.get("last_error") == Json.NULL) return;
                status.put("last_error", Json.NULL);
            } else {
                Map<String, Object> e = new LinkedHashMap<String, Object>();
                e.put("code", code);
                e.put("message", message);
                e.put("at", Codec.formatTime(client.now()));
                status.put("last_error", e);
            }
            store().writeStatus(unit, status);
        } catch (Rejected | RuntimeException e) {
            // the error itself is returned to the app; its record is best effort
        }
    }

    // --- results ---------------------------------------------------------------------------------

    @SuppressWarnings("unchecked")
    UpdateResult result(Map<String, Object> installed, boolean updated, boolean notModified, long downloaded, Decision decision) {
        Map<String, InstalledModel> models = new LinkedHashMap<String, InstalledModel>();
        Map<String, Object> members = (Map<String, Object>) installed.get("members");
        for (Map.Entry<String, Object> e : new TreeMap<String, Object>(members).entrySet()) {
            models.put(e.getKey(), model(e.getKey(), (Map<String, Object>) e.getValue()));
        }
        return new UpdateResult(unit, client.tier, (String) installed.get("version"), Boolean.TRUE.equals(installed.get("is_candidate")),
                updated, notModified, decision == null ? null : decision.fallback, decision == null ? null : decision.substitute, null, Boolean.TRUE.equals(installed.get("bundled")),
                downloaded, null, null, models);
    }

    @SuppressWarnings("unchecked")
    InstalledModel model(String name, Map<String, Object> m) {
        Map<String, Object> runtime = (Map<String, Object>) m.get("runtime");
        List<String> backends = new ArrayList<String>();
        for (Object b : (List<Object>) runtime.get("backends")) backends.add((String) b);
        Map<String, Object> contract = m.get("contract") instanceof Map ? (Map<String, Object>) m.get("contract") : null;
        List<String> labels = null;
        if (contract != null && contract.get("labels") instanceof List) {
            labels = new ArrayList<String>();
            for (Object o : (List<Object>) contract.get("labels")) labels.add((String) o);
        } else if (contract != null && contract.get("labels_blob") instanceof Map) {
            Map<String, Object> lb = (Map<String, Object>) contract.get("labels_blob");
            try {
                labels = readLabels(name, (String) lb.get("sha256"), Health.num(lb.get("size")));
            } catch (Rejected r) {
                labels = null;
            }
        }
        String probe = m.get("probe_sha256") instanceof String ? (String) m.get("probe_sha256") : null;
        return new InstalledModel(name, store().blob((String) m.get("sha256")), (String) m.get("version"), (String) m.get("variant"),
                (String) m.get("sha256"), (int) Health.num(runtime.get("threads")), backends, (String) runtime.get("precision"),
                (String) m.get("min_mnn_runtime"), contract == null ? null : new ModelContract(contract), labels,
                probe == null ? null : store().blob(probe), m.get("backend") instanceof String ? (String) m.get("backend") : null,
                m.get("runtime_rule") instanceof Json.Num || m.get("runtime_rule") instanceof Number ? Integer.valueOf((int) Health.num(m.get("runtime_rule"))) : null);
    }

    // --- status, revert, health ------------------------------------------------------------------

    @SuppressWarnings("unchecked")
    Status status(boolean verify) {
        Map<String, Object> installed = null;
        try {
            installed = store().readInstalled(kind, unit);
        } catch (Rejected r) {
            installed = null;
        }
        Map<String, Object> st = store().readStatus(unit);
        Status.Pending pending = null;
        if (st.get("pending") instanceof Map) {
            Map<String, Object> p = (Map<String, Object>) st.get("pending");
            long remaining = 0;
            long total = 0;
            if (p.get("blobs") instanceof List) {
                for (Object b : (List<Object>) p.get("blobs")) {
                    Map<String, Object> blob = (Map<String, Object>) b;
                    String sha = (String) blob.get("sha256");
                    long size = Health.num(blob.get("size"));
                    total += size;
                    if (store().hasBlob(sha, size)) continue;
                    File part = store().part(sha);
                    remaining += Math.max(0, size - (part.isFile() ? part.length() : 0));
                }
            }
            pending = new Status.Pending((String) p.get("version"), Boolean.TRUE.equals(p.get("is_candidate")), total, remaining,
                    Health.str(p.get("deferred")), String.valueOf(p.get("since")));
        }
        String code = null;
        String message = null;
        String at = null;
        if (st.get("last_error") instanceof Map) {
            Map<String, Object> e = (Map<String, Object>) st.get("last_error");
            code = Health.str(e.get("code"));
            message = Health.str(e.get("message"));
            at = Health.str(e.get("at"));
        }
        List<String> refused = new ArrayList<String>(store().readBad(unit).keySet());
        boolean ready = installed != null && intact(installed, verify);
        Status.Installed now = installed == null ? null : summary(installed);
        Status.Installed lastGood = installed != null && installed.get("previous") instanceof Map ? summary((Map<String, Object>) installed.get("previous")) : null;
        return new Status(unit, now, lastGood, pending, code, message, at, refused, ready);
    }

    @SuppressWarnings("unchecked")
    private Status.Installed summary(Map<String, Object> rec) {
        Map<String, String[]> members = new TreeMap<String, String[]>();
        for (Map.Entry<String, Object> e : ((Map<String, Object>) rec.get("members")).entrySet()) {
            Map<String, Object> m = (Map<String, Object>) e.getValue();
            members.put(e.getKey(), new String[] {(String) m.get("version"), (String) m.get("sha256")});
        }
        return new Status.Installed((String) rec.get("version"), Boolean.TRUE.equals(rec.get("is_candidate")), Boolean.TRUE.equals(rec.get("bundled")), members);
    }

    @SuppressWarnings("unchecked")
    private boolean intact(Map<String, Object> rec, boolean verify) {
        for (Object o : ((Map<String, Object>) rec.get("members")).values()) {
            Map<String, Object> m = (Map<String, Object>) o;
            String sha = (String) m.get("sha256");
            File f = store().blob(sha);
            if (!f.isFile() || f.length() != Health.num(m.get("size"))) return false;
            if (verify && !sha.equals(hashFile(f))) return false;
        }
        return true;
    }

    static String hashFile(File f) {
        try {
            java.security.MessageDigest d = Codec.sha256();
            InputStream in = new FileInputStream(f);
            try {
                byte[] buf = new byte[CHUNK];
                int n;
                while ((n = in.read(buf)) > 0) d.update(buf, 0, n);
            } finally {
                in.close();
            }
            return Codec.hex(d.digest());
        } catch (IOException e) {
            return null;
        }
    }

    /** Switch back to the last good set and mark the current release bad on this device. */
    @SuppressWarnings("unchecked")
    UpdateResult revert(String reason) {
        lock.lock();
        try {
            return revertLocked(reason);
        } finally {
            lock.unlock();
        }
    }

    @SuppressWarnings("unchecked")
    private UpdateResult revertLocked(String reason) {
        try {
            Map<String, Object> record = store().readInstalled(kind, unit);
            if (record == null) return empty(null, null);
            String version = (String) record.get("version");
            store().markBad(unit, version, "reverted: " + reason);
            Map<String, Object> previous = record.get("previous") instanceof Map ? (Map<String, Object>) record.get("previous") : null;
            if (previous != null && !intact(previous, false)) previous = null;
            if (previous != null) previous.put("previous", Json.NULL);
            store().writeInstalled(kind, unit, previous);
            recordError(Reasons.REVERTED, version + " reverted: " + reason);
            store().evict();
            client.health.reverted(unit, previous == null ? null : (String) previous.get("version"));
            String to = previous == null ? null : (String) previous.get("version");
            for (String name : ((Map<String, Object>) record.get("members")).keySet()) client.reporter.reverted(unit, name, to);
            client.notifyChange(new ModelChange(unit, ModelChange.REVERTED, to, version));
            return previous == null ? empty(null, null) : result(previous, true, false, 0, null);
        } catch (Rejected r) {
            return empty(r.code, r.getMessage());
        } catch (RuntimeException e) {
            return empty(Reasons.INTERNAL, String.valueOf(e));
        }
    }

    /** What an update would do now, without downloading a blob. */
    @SuppressWarnings("unchecked")
    UpdateCheck check(DownloadPolicy.Conditions conditions) {
        lock.lock();
        String now = null;
        try {
            Map<String, Object> installed = store().readInstalled(kind, unit);
            now = installed == null ? null : (String) installed.get("version");
            Http http = client.http();
            http.startDeadline();
            Decision decision = avoidBad((Decision) acceptManifest(http, false)[0]);
            Wire.Unit chosen = decision.unit;
            if (chosen == null) return new UpdateCheck(false, null, now, false, 0, null, decision.fallback, null, null);
            boolean same = installed != null && (String.valueOf(installed.get("version")).equals(chosen.version));
            if (same) {
                Map<String, Object> members = (Map<String, Object>) installed.get("members");
                for (Map.Entry<String, Wire.Entry> e : chosen.members.entrySet()) {
                    Object m = members == null ? null : members.get(e.getKey());
                    same &= m instanceof Map && e.getValue().blob.sha256.equals(((Map<String, Object>) m).get("sha256"));
                }
            }
            long remaining = 0;
            List<Wire.BlobRef> missing = new ArrayList<Wire.BlobRef>();
            for (Wire.Entry e : chosen.members.values()) {
                for (Wire.BlobRef ref : e.blobs()) {
                    if (store().hasBlob(ref.sha256, ref.size) || contains(missing, ref)) continue;
                    missing.add(ref);
                    File part = store().part(ref.sha256);
                    remaining += Math.max(0, ref.size - (part.isFile() ? part.length() : 0));
                }
            }
            String deferred = same || missing.isEmpty() ? null : client.policy.unmet(conditions);
            return new UpdateCheck(!same, chosen.version, now, decision.isCandidate, same ? 0 : remaining, deferred, decision.fallback, null, null);
        } catch (Rejected r) {
            return new UpdateCheck(false, now, now, false, 0, null, null, r.code, r.getMessage());
        } catch (RuntimeException e) {
            return new UpdateCheck(false, now, now, false, 0, null, null, Reasons.INTERNAL, String.valueOf(e));
        } finally {
            lock.unlock();
        }
    }

    /** Delete the unit's install, its last good set and their blobs; false when nothing was installed. */
    boolean delete() {
        lock.lock();
        try {
            Map<String, Object> record = store().readInstalled(kind, unit);
            setPending(null, null, null);
            if (record == null) return false;
            store().writeInstalled(kind, unit, null);
            store().evict();
            client.health.reverted(unit, null);
            client.notifyChange(new ModelChange(unit, ModelChange.DELETED, null, (String) record.get("version")));
            return true;
        } catch (Rejected | RuntimeException e) {
            recordError(e instanceof Rejected ? ((Rejected) e).code : Reasons.INTERNAL, String.valueOf(e.getMessage()));
            return false;
        } finally {
            lock.unlock();
        }
    }

    /** appStarted was called in this process: an install now runs under that start (section 11). */
    private volatile boolean started;

    AppStart appStarted() throws Rejected {
        lock.lock();
        try {
            return appStartedLocked();
        } finally {
            lock.unlock();
        }
    }

    private AppStart appStartedLocked() throws Rejected {
        started = true;
        Object[] before = client.health.unconfirmed(unit);
        String[] due = client.health.appStarted(unit);
        // The count went up: its report goes first, the revert's own report after it.
        reportUnconfirmed(before);
        if (due == null) return null;
        Map<String, Object> record = store().readInstalled(kind, unit);
        if (record == null || !due[0].equals(record.get("version"))) {
            // Something else is installed by now: nothing to take back.
            client.health.reverted(unit, record == null ? null : (String) record.get("version"));
            return null;
        }
        String reason = unit + " " + due[0] + " not confirmed after " + due[2] + " app starts";
        UpdateResult now = revertLocked(reason);
        return new AppStart(unit, due[0], now.version, reason);
    }

    /** A start was counted against the unconfirmed install: report the count now (docs/protocol.md section 11). */
    @SuppressWarnings("unchecked")
    private void reportUnconfirmed(Object[] before) throws Rejected {
        Object[] now = client.health.unconfirmed(unit);
        if (now == null || (Long) now[1] == 0 || (before != null && before[0].equals(now[0]) && (Long) now[1] <= (Long) before[1])) return;
        Map<String, Object> record = store().readInstalled(kind, unit);
        if (record == null || !now[0].equals(record.get("version"))) return;
        for (String name : ((Map<String, Object>) record.get("members")).keySet()) client.reporter.unconfirmed(unit, name, (Long) now[1]);
    }

    @SuppressWarnings("unchecked")
    boolean confirm(String version) throws Rejected {
        lock.lock();
        try {
            return confirmLocked(version);
        } finally {
            lock.unlock();
        }
    }

    @SuppressWarnings("unchecked")
    private boolean confirmLocked(String version) throws Rejected {
        boolean confirmed = client.health.confirm(unit, version);
        if (confirmed) {
            Map<String, Object> record = store().readInstalled(kind, unit);
            if (record != null) {
                for (String name : ((Map<String, Object>) record.get("members")).keySet()) client.reporter.flag(unit, name, "confirmed");
            }
        }
        return confirmed;
    }

    @SuppressWarnings("unchecked")
    void reportLatency() {
        try {
            Map<String, Object> record = store().readInstalled(kind, unit);
            if (record == null) return;
            for (String name : ((Map<String, Object>) record.get("members")).keySet()) client.reporter.summary(unit, name);
        } catch (Rejected r) {
            // reports never fail anything
        }
    }
}
