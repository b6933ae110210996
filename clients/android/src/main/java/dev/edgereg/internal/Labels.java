package dev.edgereg.internal;

import java.util.ArrayList;
import java.util.List;

/** A labels blob (docs/protocol.md section 8): strict JSON holding an array of strings. */
public final class Labels {
    public static final long MAX_BYTES = 4L * 1024 * 1024;

    private Labels() {}

    public static List<String> parse(byte[] data, String name) throws Rejected {
        Object v;
        try {
            v = Json.parse(data);
        } catch (Json.JsonException e) {
            throw new Rejected(Reasons.MALFORMED, "the labels of " + name + " are not strict JSON: " + e.getMessage());
        }
        if (!(v instanceof List)) throw new Rejected(Reasons.MALFORMED, "the labels of " + name + " are not a JSON array of strings");
        List<String> out = new ArrayList<String>();
        for (Object o : (List<?>) v) {
            if (!(o instanceof String)) throw new Rejected(Reasons.MALFORMED, "the labels of " + name + " are not a JSON array of strings");
            out.add((String) o);
        }
        return out;
    }
}
