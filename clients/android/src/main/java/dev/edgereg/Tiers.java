package dev.edgereg;

import dev.edgereg.internal.Json;
import dev.edgereg.internal.Rules;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import javax.annotation.Nonnull;
import javax.annotation.Nullable;

/**
 * The published tier rules ({@code [tiers]} of models.toml, best first) and the tier a device
 * lands in, with why (docs/protocol.md section 5).
 */
public final class Tiers {
    private final LinkedHashMap<String, Rules.TierRules> rules;

    private Tiers(LinkedHashMap<String, Rules.TierRules> rules) {
        this.rules = rules;
    }

    /** The tier a device resolved to and why, in words. */
    public static final class Resolution {
        @Nonnull public final String tier;
        @Nonnull public final String reason;

        Resolution(String tier, String reason) {
            this.tier = tier;
            this.reason = reason;
        }
    }

    /**
     * Tiers from JSON: an object whose key order is the tier order, best first, each value the
     * tier's rules ({@code min_ram_mb}, {@code min_cpu_cores}, {@code soc_allow}, {@code os}).
     *
     * @throws IllegalArgumentException the text is not such an object
     */
    @Nonnull
    @SuppressWarnings("unchecked")
    public static Tiers fromJson(@Nonnull String json) {
        Object parsed;
        try {
            parsed = Json.parse(json);
        } catch (Json.JsonException e) {
            throw new IllegalArgumentException("tiers are not JSON: " + e.getMessage());
        }
        if (!(parsed instanceof Map)) throw new IllegalArgumentException("tiers must be a JSON object, best tier first");
        LinkedHashMap<String, Rules.TierRules> out = new LinkedHashMap<String, Rules.TierRules>();
        for (Map.Entry<String, Object> e : ((Map<String, Object>) parsed).entrySet()) {
            if (!(e.getValue() instanceof Map)) throw new IllegalArgumentException("tier " + e.getKey() + ": rules must be an object");
            out.put(e.getKey(), rulesFromJson((Map<String, Object>) e.getValue()));
        }
        return new Tiers(out);
    }

    @SuppressWarnings("unchecked")
    static Rules.TierRules rulesFromJson(Map<String, Object> r) {
        return new Rules.TierRules(num(r.get("min_ram_mb")), num(r.get("min_cpu_cores")),
                strings(r.get("soc_allow")), strings(r.get("os")));
    }

    private static Long num(Object v) {
        if (v == null || v == Json.NULL) return null;
        if (!(v instanceof Json.Num) || ((Json.Num) v).longValue() == null) throw new IllegalArgumentException("tier rule must be an integer, got " + v);
        return ((Json.Num) v).longValue();
    }

    private static List<String> strings(Object v) {
        if (v == null || v == Json.NULL) return null;
        if (!(v instanceof List)) throw new IllegalArgumentException("tier rule must be a list of strings");
        List<String> out = new ArrayList<String>();
        for (Object o : (List<?>) v) {
            if (!(o instanceof String)) throw new IllegalArgumentException("tier rule must be a list of strings");
            out.add((String) o);
        }
        return Collections.unmodifiableList(out);
    }

    /** The first tier whose every rule the device meets, or null when none does (no catch-all). */
    @Nullable
    public Resolution resolve(@Nonnull DeviceFacts device) {
        return resolve(rules, device);
    }

    static Resolution resolve(Map<String, Rules.TierRules> tiers, DeviceFacts d) {
        StringBuilder why = new StringBuilder();
        for (Map.Entry<String, Rules.TierRules> e : tiers.entrySet()) {
            List<String> unmet = Rules.unmet(e.getValue(), d.ramMb, d.cpuCores, d.soc, d.os);
            if (unmet.isEmpty()) {
                if (why.length() > 0) why.append("; ");
                why.append(Rules.met(e.getKey(), e.getValue(), d.ramMb, d.cpuCores, d.soc, d.os));
                return new Resolution(e.getKey(), why.toString());
            }
            if (why.length() > 0) why.append("; ");
            why.append("not ").append(e.getKey()).append(": ");
            for (int i = 0; i < unmet.size(); i++) why.append(i > 0 ? "; " : "").append(unmet.get(i));
        }
        return null;
    }
}
