package dev.edgereg.internal;

/**
 * A refusal with one of the protocol's reason codes (docs/protocol.md section 7) or a client
 * code ({@code transport}, {@code cache}, ...). Internal: the public API turns it into a result.
 */
public class Rejected extends Exception {
    public final String code;
    /** A permanent refusal marks the release bad on this device (a failed golden probe). */
    public final boolean permanent;

    public Rejected(String code, String message) {
        this(code, message, false);
    }

    public Rejected(String code, String message, boolean permanent) {
        super(message);
        this.code = code;
        this.permanent = permanent;
    }

    public Rejected(String code, String message, Throwable cause) {
        super(message, cause);
        this.code = code;
        this.permanent = false;
    }
}
