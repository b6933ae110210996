package dev.edgereg.internal;

/** The reason codes of docs/protocol.md section 7 and the client's own codes. */
public final class Reasons {
    private Reasons() {}

    public static final String MALFORMED = "malformed";
    public static final String UNKNOWN_KEY = "unknown-key";
    public static final String BAD_SIGNATURE = "bad-signature";
    public static final String WRONG_MODEL = "wrong-model";
    public static final String WRONG_TIER = "wrong-tier";
    public static final String ROLLBACK = "rollback";
    public static final String EXPIRED = "expired";
    public static final String RUNTIME_TOO_OLD = "runtime-too-old";
    public static final String APP_INCOMPATIBLE = "app-incompatible";
    public static final String OS_INCOMPATIBLE = "os-incompatible";
    public static final String INSUFFICIENT_MEMORY = "insufficient-memory";
    public static final String CPU_UNSUPPORTED = "cpu-unsupported";
    public static final String BLOB_TOO_LARGE = "blob-too-large";
    public static final String BAD_BLOB = "bad-blob";
    public static final String PROBE_FAILED = "probe-failed";
    public static final String PROBE_NOT_RUN = "probe-not-run";
    public static final String CANCELLED = "cancelled";
    public static final String BAD_RELEASE = "bad-release";
    public static final String TRANSPORT = "transport";
    public static final String NOT_FOUND = "not-found";
    public static final String CACHE = "cache";
    public static final String NO_SPACE = "no-space";
    public static final String UNTRUSTED = "untrusted";
    public static final String REVERTED = "reverted";
    public static final String INTERNAL = "internal";
}
