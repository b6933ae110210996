package dev.edgereg;

import dev.edgereg.internal.Cancel;
import dev.edgereg.internal.Codec;
import dev.edgereg.internal.CpuFeatures;
import dev.edgereg.internal.Ed25519;
import dev.edgereg.internal.Http;
import dev.edgereg.internal.Reasons;
import dev.edgereg.internal.Rejected;
import dev.edgereg.internal.Store;
import java.io.File;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Executor;
import javax.annotation.Nonnull;
import javax.annotation.Nullable;

/**
 * The edgereg client: fetches, verifies and installs signed MNN models (docs/protocol.md).
 *
 * <pre>{@code
 * EdgeregClient client = EdgeregClient.builder("https://cdn.example.com/registry/", new File(getFilesDir(), "models"))
 *     .trustedKey(readAsset("registry.pub.pem"))
 *     .device(DeviceFacts.builder(installId).ramMb(ramMb).cpuCores(cores).soc(Build.SOC_MODEL)
 *         .os("android", String.valueOf(Build.VERSION.SDK_INT)).mnnRuntime("3.6.1").appVersion(BuildConfig.VERSION_NAME).build())
 *     .tiers(Tiers.fromJson(readAsset("tiers.json")))
 *     .model("digits")
 *     .runner(new MnnRunner())
 *     .policy(new DownloadPolicy(false, false, 8 << 20))
 *     .build();
 * }</pre>
 *
 * <p>Threads: {@link #update}, {@link #current}, {@link #status}, {@link #appStarted},
 * {@link #confirm} and {@link #revert} read and write files and (update) the network: they
 * block, so call them on a worker thread (a WorkManager Worker, an Executor); {@link #updateAsync}
 * takes an Executor. None of them throws for network, trust, disk or model problems: the result
 * carries a reason code and the last good install. Only misuse (an unknown unit, a bad builder
 * argument) throws, and only {@link IllegalArgumentException} or {@link IllegalStateException}.
 */
public final class EdgeregClient {
    public static final String SDK_VERSION = "0.2.0";

    final String registry;
    final Map<String, byte[]> trusted;
    final Store store;
    final DeviceFacts device;
    final String tier;
    final String tierReason;
    final ModelRunner runner;
    final boolean selfTest;
    final DownloadPolicy policy;
    final Ed25519 ed25519;
    final Health health;
    final Reporter reporter;
    /** What this device knows of itself for an entry's runtime_hints (section 11). */
    final dev.edgereg.internal.Rules.HintFacts hintFacts;
    final int timeoutMs;
    final long deadlineMs;
    final long minRate;
    final Transport transport;
    private final Clock clock;
    private final Map<String, Engine> engines = new LinkedHashMap<String, Engine>();

    /** The time source (epoch seconds); tests and the device program set their own. */
    public interface Clock {
        long nowSeconds();
    }

    private EdgeregClient(Builder b) {
        this.registry = b.registry.endsWith("/") ? b.registry : b.registry + "/";
        this.trusted = Collections.unmodifiableMap(new LinkedHashMap<String, byte[]>(b.trusted));
        this.store = new Store(b.cacheDir);
        this.device = b.device;
        if (b.tier != null) {
            this.tier = b.tier;
            this.tierReason = "tier " + b.tier + ": set by the app";
        } else {
            Tiers.Resolution r = b.tiers.resolve(b.device);
            if (r == null) throw new IllegalArgumentException("the device matches none of the tiers (they need a catch-all last)");
            this.tier = r.tier;
            this.tierReason = r.reason;
        }
        this.runner = b.runner;
        this.selfTest = b.selfTest;
        this.policy = b.policy;
        this.ed25519 = b.ed25519 != null ? b.ed25519 : Ed25519.best();
        this.health = new Health(store, b.maxUnconfirmedStarts);
        this.clock = b.clock != null ? b.clock : new Clock() {
            @Override public long nowSeconds() {
                return System.currentTimeMillis() / 1000L;
            }
        };
        String cpuClass = CpuFeatures.cpuClass(b.device.cpuFeatures, System.getProperty("os.arch"));
        this.reporter = new Reporter(b.reporting, registry, b.device, b.deviceClass, cpuClass, b.transport, store, clock);
        this.hintFacts = new dev.edgereg.internal.Rules.HintFacts(
                cpuClass, b.device.cpuCoresSaid ? Integer.valueOf(b.device.cpuCores) : null, hintSoc());
        this.timeoutMs = b.timeoutMs;
        this.deadlineMs = b.deadlineMs;
        this.minRate = b.minRate;
        this.transport = b.transport;
        for (Map.Entry<String, Boolean> u : b.units.entrySet()) {
            engines.put(u.getKey(), new Engine(this, u.getKey(), u.getValue(), b.bundled.get(u.getKey())));
        }
    }

    @Nonnull
    public static Builder builder(@Nonnull String registryUrl, @Nonnull File cacheDir) {
        return new Builder(registryUrl, cacheDir);
    }

    long now() { return clock.nowSeconds(); }

    /**
     * The SoC family a hint rule's {@code soc} is compared with (section 11, "Runtime hints"):
     * {@code Build.SOC_MANUFACTURER + " " + Build.SOC_MODEL} from API 31, else
     * {@code Build.HARDWARE}; null off Android or when the platform names none. Read by
     * reflection: the library compiles without android.jar.
     */
    static String hintSoc() {
        try {
            Class<?> build = Class.forName("android.os.Build");
            String soc = null;
            try {
                String maker = (String) build.getField("SOC_MANUFACTURER").get(null);
                String model = (String) build.getField("SOC_MODEL").get(null);
                if (usable(maker) && usable(model)) soc = maker + " " + model;
            } catch (NoSuchFieldException e) {
                soc = null; // before API 31
            }
            if (soc == null) {
                String hardware = (String) build.getField("HARDWARE").get(null);
                if (usable(hardware)) soc = hardware;
            }
            return soc;
        } catch (ClassNotFoundException | NoSuchFieldException | IllegalAccessException | ClassCastException e) {
            return null; // not Android
        }
    }

    private static boolean usable(String s) {
        return s != null && !s.isEmpty() && !s.equals("unknown");
    }

    Http http() { return new Http(registry, timeoutMs, deadlineMs, minRate, transport); }

    long freeSpace() { return store.usableSpace(); }

    /** The tier this device is in, and why. */
    @Nonnull public String tier() { return tier; }

    @Nonnull public String tierReason() { return tierReason; }

    /** The units this client was built for (models and bundles). */
    @Nonnull public List<String> units() { return new ArrayList<String>(engines.keySet()); }

    /** Which Ed25519 implementation verifies: {@code platform}, {@code bouncycastle}, or {@code none}. */
    @Nonnull public String ed25519Provider() { return ed25519 == null ? "none" : ed25519.name(); }

    private Engine engine(String unit) {
        Engine e = engines.get(unit);
        if (e == null) throw new IllegalArgumentException("'" + unit + "' is not a unit of this client (builder: model() or bundle())");
        return e;
    }

    private String only() {
        if (engines.size() != 1) throw new IllegalStateException("this client has " + engines.size() + " units: name one");
        return engines.keySet().iterator().next();
    }

    /**
     * Check for an update of {@code unit} and install it. Blocks (network, disk, self-test): a
     * worker thread. {@code conditions}: what the platform says now (null says nothing; a
     * condition the policy requires and nobody said is unmet, so the update waits).
     * Interrupting the calling thread, or {@link #cancel}, stops it within a second with
     * {@code cancelled}, nothing installed and the download kept for a resume.
     */
    @Nonnull
    public UpdateResult update(@Nonnull String unit, @Nullable DownloadPolicy.Conditions conditions, @Nullable ProgressListener progress) {
        return engine(unit).update(conditions == null ? DownloadPolicy.Conditions.unknown() : conditions, progress, new Cancel());
    }

    @Nonnull
    public UpdateResult update(@Nonnull String unit, @Nullable DownloadPolicy.Conditions conditions) {
        return update(unit, conditions, null);
    }

    @Nonnull public UpdateResult update(@Nonnull String unit) { return update(unit, null, null); }

    @Nonnull public UpdateResult update() { return update(only(), null, null); }

    /**
     * {@link #update} on {@code executor}, as a future: {@code future.cancel(true)} cancels the
     * update itself (from any thread; within a second; nothing installed). From Kotlin
     * coroutines, {@code future.await()} (kotlinx-coroutines-jdk8) cancels it with the coroutine.
     */
    @Nonnull
    public UpdateFuture updateAsync(@Nonnull String unit, @Nullable final DownloadPolicy.Conditions conditions, @Nonnull Executor executor,
            @Nullable final ProgressListener progress) {
        final Engine e = engine(unit);
        final Cancel token = new Cancel();
        final UpdateFuture future = new UpdateFuture(token);
        try {
            executor.execute(new Runnable() {
                @Override public void run() {
                    if (future.isDone()) return; // cancelled before it started
                    future.complete(e.update(conditions == null ? DownloadPolicy.Conditions.unknown() : conditions, progress, token));
                }
            });
        } catch (java.util.concurrent.RejectedExecutionException x) {
            future.complete(e.empty(Reasons.INTERNAL, "the executor refused the update: " + x.getMessage()));
        }
        return future;
    }

    /** {@link #update} on {@code executor}; {@code callback} gets the result there. */
    public void updateAsync(@Nonnull final String unit, @Nullable final DownloadPolicy.Conditions conditions, @Nonnull Executor executor,
            @Nonnull final Callback<UpdateResult> callback) {
        final Engine e = engine(unit);
        executor.execute(new Runnable() {
            @Override public void run() {
                callback.done(e.update(conditions == null ? DownloadPolicy.Conditions.unknown() : conditions));
            }
        });
    }

    /** Cancel the update of {@code unit} in progress, if any (idempotent; from any thread; never blocks). */
    public void cancel(@Nonnull String unit) { engine(unit).cancel(); }

    /**
     * Whether an update of {@code unit} would install a release, which, and how many bytes it
     * would download, without downloading a blob (the manifest is fetched and verified). Blocks
     * (network): a worker thread. Never throws for network, trust or disk problems.
     */
    @Nonnull
    public UpdateCheck check(@Nonnull String unit, @Nullable DownloadPolicy.Conditions conditions) {
        return engine(unit).check(conditions == null ? DownloadPolicy.Conditions.unknown() : conditions);
    }

    /**
     * Delete {@code unit} from the device: its install, its last good set and their files. The
     * rollback protection and the releases refused here stay. Idempotent: false when nothing was
     * installed. Blocks on disk.
     */
    public boolean delete(@Nonnull String unit) { return engine(unit).delete(); }

    /** Every model and bundle installed in this client's cache. Reads disk. */
    @Nonnull
    @SuppressWarnings("unchecked")
    public List<InstalledUnit> installedUnits() {
        List<InstalledUnit> out = new ArrayList<InstalledUnit>();
        for (String kind : new String[] {"models", "bundles"}) {
            Map<String, Object> all;
            try {
                all = store.read(new File(store.root, "installed.json"));
            } catch (Rejected r) {
                return out;
            }
            Object byKind = all == null ? null : all.get(kind);
            if (!(byKind instanceof Map)) continue;
            for (String name : new java.util.TreeSet<String>(((Map<String, Object>) byKind).keySet())) {
                Object rec = ((Map<String, Object>) byKind).get(name);
                if (!(rec instanceof Map)) continue;
                Map<String, Object> r = (Map<String, Object>) rec;
                out.add(new InstalledUnit(name, kind.equals("models") ? "model" : "bundle", String.valueOf(r.get("version")),
                        Boolean.TRUE.equals(r.get("is_candidate"))));
            }
        }
        return out;
    }

    private final java.util.concurrent.CopyOnWriteArrayList<ModelListener> listeners = new java.util.concurrent.CopyOnWriteArrayList<ModelListener>();

    /** Hear each change of what is installed (installed, rolled-back, reverted, deleted), on the thread that made it. */
    public void addListener(@Nonnull ModelListener listener) { listeners.add(listener); }

    public void removeListener(@Nonnull ModelListener listener) { listeners.remove(listener); }

    void notifyChange(ModelChange change) {
        for (ModelListener l : listeners) {
            try {
                l.onChange(change);
            } catch (RuntimeException e) {
                // the app's listener never breaks the client
            }
        }
    }

    /** Receives the result of an async call. */
    public interface Callback<T> {
        void done(@Nonnull T result);
    }

    /** What is installed (files, contract, labels), without the network; installs the shipped release on first use. Blocks on disk. */
    @Nonnull public UpdateResult current(@Nonnull String unit) { return engine(unit).current(); }

    @Nonnull public UpdateResult current() { return current(only()); }

    /** Installed, last good, pending, last error, refused versions, ready (blobs hashed again when {@code verify}). Blocks on disk. */
    @Nonnull public Status status(@Nonnull String unit, boolean verify) {
        Engine e = engine(unit);
        try {
            return e.status(verify);
        } catch (RuntimeException x) {
            // A cache damaged beyond reading: report it as nothing ready, never as a crash.
            return new Status(unit, null, null, null, Reasons.CACHE, String.valueOf(x), null, new ArrayList<String>(), false);
        }
    }

    @Nonnull public Status status(@Nonnull String unit) { return status(unit, true); }

    @Nonnull public Status status() { return status(only(), true); }

    /**
     * Call at every start of the app, before loading a model (before or after {@link #update}):
     * counts the start before it against an unconfirmed install when that start ran it and ended
     * without a confirmation, and reverts those not confirmed over {@code maxUnconfirmedStarts}
     * such starts (docs/protocol.md section 11). Returns the reverts carried out (load current()
     * then).
     */
    @Nonnull
    public List<AppStart> appStarted() {
        List<AppStart> out = new ArrayList<AppStart>();
        for (Engine e : engines.values()) {
            try {
                AppStart a = e.appStarted();
                if (a != null) out.add(a);
            } catch (Rejected | RuntimeException x) {
                e.recordError(x instanceof Rejected ? ((Rejected) x).code : Reasons.INTERNAL, String.valueOf(x.getMessage()));
            }
        }
        return out;
    }

    /**
     * The app's first real inference with the installed release of {@code unit} succeeded.
     * {@code version}: the version the app ran (null: whatever is installed); a confirmation of
     * another version than the installed one does not count. Returns true when it confirmed.
     */
    public boolean confirm(@Nonnull String unit, @Nullable String version) {
        Engine e = engine(unit);
        try {
            return e.confirm(version);
        } catch (Rejected | RuntimeException x) {
            e.recordError(x instanceof Rejected ? ((Rejected) x).code : Reasons.INTERNAL, String.valueOf(x.getMessage()));
            return false;
        }
    }

    public boolean confirm() { return confirm(only(), null); }

    /** One real inference's latency for the next report ({@code model}: the unit or a bundle member). Never blocks. */
    public void recordInference(@Nonnull String model, double ms) { reporter.recordInference(model, ms); }

    public void recordInference(double ms) { recordInference(only(), ms); }

    /**
     * The memory the app measured for the installed {@code model} (the unit, or a bundle member),
     * in MiB: its peak and its steady use (null: not measured). The client never guesses them:
     * without this call the reports carry none. Sent at once and kept in the later reports of
     * this install. A figure outside 0 to 1048576 is dropped. Writes a small file: call it off
     * the main thread.
     */
    public void recordMemory(@Nonnull String model, @Nullable Double peakMb, @Nullable Double steadyMb) {
        reporter.memory(model, peakMb, steadyMb);
    }

    public void recordMemory(double peakMb, double steadyMb) { recordMemory(only(), peakMb, steadyMb); }

    /**
     * Count one event of the app metric {@code metric} of {@code unit}, a {@code rate}: whether it
     * succeeded (docs/protocol.md section 3, "App metrics"). The count goes with the installed
     * release: kept across app restarts, never reset within its install, and sent as totals with
     * its reports (only counts, never a value). From any thread; it never blocks on the disk or
     * the network (the counts are written moments later on a background thread).
     *
     * @return true when counted; false when nothing is installed (nothing is counted then) or
     *     reporting is off
     * @throws IllegalArgumentException the installed release declares no rate of that name (a
     *     programming error: declare it in models.toml, or call {@link #observe} for a distribution)
     */
    public boolean record(@Nonnull String unit, @Nonnull String metric, boolean success) {
        return engine(unit).count(metric, true, success ? 1 : 0, 0);
    }

    /** {@link #record(String, String, boolean)} for the client's one unit. */
    public boolean record(@Nonnull String metric, boolean success) { return record(only(), metric, success); }

    /**
     * Count one value of the app metric {@code metric} of {@code unit}, a {@code distribution},
     * in its bucket (a value equal to an edge falls in the bucket that edge closes). As
     * {@link #record}: the installed release's, from any thread, never blocking; the value itself
     * never leaves the device.
     *
     * @return true when counted; false when nothing is installed (nothing is counted then) or
     *     reporting is off
     * @throws IllegalArgumentException {@code value} is not finite, or the installed release
     *     declares no distribution of that name (a programming error)
     */
    public boolean observe(@Nonnull String unit, @Nonnull String metric, double value) {
        if (Double.isNaN(value) || Double.isInfinite(value)) {
            throw new IllegalArgumentException("observe(\"" + metric + "\", " + value + "): the value must be a finite number");
        }
        return engine(unit).count(metric, false, 0, value);
    }

    /** {@link #observe(String, String, double)} for the client's one unit. */
    public boolean observe(@Nonnull String metric, double value) { return observe(only(), metric, value); }

    /** The app metrics the installed release of {@code unit} declares, by name (empty: none, or nothing installed). Reads disk once per install. */
    @Nonnull
    public Map<String, AppMetric> metrics(@Nonnull String unit) { return engine(unit).declaredMetrics(); }

    /** Switch back to the last good set and mark the installed release bad on this device. Blocks on disk. */
    @Nonnull public UpdateResult revert(@Nonnull String unit, @Nonnull String reason) { return engine(unit).revert(reason); }

    /** Report again now, with the latency recorded since the last report (a periodic send). Never blocks. */
    public void reportLatency() {
        for (Engine e : engines.values()) e.reportLatency();
    }

    /** Give failed reports their one more try and wait (bounded) for reports in flight; returns how many reports were made since the last flush. */
    public int flushReports(long timeoutMs) {
        reporter.retryPending();
        return reporter.flush(timeoutMs);
    }

    /** At exit: wait up to {@code timeoutMs} for reports still being sent. */
    public void close(long timeoutMs) { reporter.close(timeoutMs); }

    public static final class Builder {
        private final String registry;
        private final File cacheDir;
        private final Map<String, byte[]> trusted = new LinkedHashMap<String, byte[]>();
        private final Map<String, Boolean> units = new LinkedHashMap<String, Boolean>();
        private final Map<String, BundledRelease> bundled = new LinkedHashMap<String, BundledRelease>();
        private DeviceFacts device;
        private String tier;
        private Tiers tiers;
        private ModelRunner runner;
        private boolean selfTest = true;
        private boolean reporting = true;
        private String deviceClass;
        private int maxUnconfirmedStarts = 3;
        private DownloadPolicy policy = DownloadPolicy.defaults();
        private int timeoutMs = 30000;
        private long deadlineMs = 600000;
        private long minRate = 1024;
        private Clock clock;
        private Ed25519 ed25519;
        private Transport transport;

        Builder(String registry, File cacheDir) {
            if (!registry.startsWith("http://") && !registry.startsWith("https://")) {
                throw new IllegalArgumentException("the registry URL must be http(s)://, got '" + registry + "'");
            }
            this.registry = registry;
            this.cacheDir = cacheDir;
        }

        /** A pinned publisher key: PEM SubjectPublicKeyInfo, DER, or the raw 32 bytes. Never from the registry. */
        @Nonnull
        public Builder trustedKey(@Nonnull byte[] key) {
            byte[] raw = Ed25519.rawPublicKey(key);
            trusted.put(Codec.sha256Hex(raw), raw);
            return this;
        }

        @Nonnull public Builder trustedKey(@Nonnull String pem) { return trustedKey(Codec.utf8(pem)); }

        @Nonnull public Builder device(@Nonnull DeviceFacts device) { this.device = device; return this; }

        /** The tier, when the app knows it (a build flavour, remote config). */
        @Nonnull public Builder tier(@Nonnull String tier) { this.tier = tier; return this; }

        /** The published tier rules, to resolve the tier from the device facts. */
        @Nonnull public Builder tiers(@Nonnull Tiers tiers) { this.tiers = tiers; return this; }

        /** A model this client keeps installed. */
        @Nonnull public Builder model(@Nonnull String name) { units.put(name, false); return this; }

        /** A bundle (models installed as one set) this client keeps installed. */
        @Nonnull public Builder bundle(@Nonnull String name) { units.put(name, true); return this; }

        /** The release the app ships for {@code unit}'s first, offline launch. */
        @Nonnull public Builder bundled(@Nonnull String unit, @Nonnull BundledRelease release) { bundled.put(unit, release); return this; }

        /** The app's MNN, for the golden-probe self-test before every switch. */
        @Nonnull public Builder runner(@Nullable ModelRunner runner) { this.runner = runner; return this; }

        /** Run the golden-probe self-test before every switch (default true; then {@link #build} needs a {@link #runner}). */
        @Nonnull public Builder selfTest(boolean on) { this.selfTest = on; return this; }

        @Nonnull public Builder policy(@Nonnull DownloadPolicy policy) { this.policy = policy; return this; }

        /** Reports (default on); off sends nothing and stores no token. */
        @Nonnull public Builder reporting(boolean on, @Nullable String deviceClass) { this.reporting = on; this.deviceClass = deviceClass; return this; }

        @Nonnull public Builder maxUnconfirmedStarts(int n) {
            if (n < 1) throw new IllegalArgumentException("maxUnconfirmedStarts must be >= 1");
            this.maxUnconfirmedStarts = n;
            return this;
        }

        /** Limits: response headers and each read, the whole update, the slowest body (bytes/s). */
        @Nonnull public Builder limits(int timeoutMs, long deadlineMs, long minRateBytesPerSecond) {
            this.timeoutMs = timeoutMs;
            this.deadlineMs = deadlineMs;
            this.minRate = minRateBytesPerSecond;
            return this;
        }

        @Nonnull public Builder clock(@Nonnull Clock clock) { this.clock = clock; return this; }

        /**
         * The HTTP transport: an app's own stack, or a test's. Null (the default): the platform's
         * HttpURLConnection (OkHttp inside on Android). See {@link Transport}.
         */
        @Nonnull public Builder transport(@Nullable Transport transport) { this.transport = transport; return this; }

        /** Force an Ed25519 implementation: {@code "platform"} or {@code "bouncycastle"} (tests). */
        @Nonnull public Builder ed25519(@Nonnull String provider) {
            this.ed25519 = provider.equals("platform") ? Ed25519.platform() : Ed25519.bouncyCastle();
            if (this.ed25519 == null) throw new IllegalArgumentException("Ed25519 provider '" + provider + "' is not available here");
            return this;
        }

        /**
         * @throws IllegalArgumentException a missing key, device, unit, or tier
         * @throws IllegalStateException the self-test is on and there is no runner
         */
        @Nonnull
        public EdgeregClient build() {
            if (trusted.isEmpty()) throw new IllegalArgumentException("pin at least one publisher key (trustedKey)");
            if (device == null) throw new IllegalArgumentException("device facts are needed (device)");
            if (units.isEmpty()) throw new IllegalArgumentException("name at least one model or bundle");
            if ((tier == null) == (tiers == null)) throw new IllegalArgumentException("give exactly one of tier() and tiers()");
            if (selfTest && runner == null) {
                // Every probe would "fail" and mark good releases bad on this device, and its
                // reports would halt every canary (docs/protocol.md section 11, no runner, no poison).
                throw new IllegalStateException("the self-test is on (the default) and there is no model runner: give runner(new MnnRunner(...)) "
                        + "(docs/guides/android.md), or selfTest(false) to install without checking the golden probe");
            }
            for (String u : bundled.keySet()) {
                if (!units.containsKey(u)) throw new IllegalArgumentException("bundled release for '" + u + "', which is not a unit");
            }
            return new EdgeregClient(this);
        }
    }
}
