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
     * The tier file {@code edgereg tiers} exports from models.toml (docs/protocol.md section 5):
     * {@code {"schema_version": 1, "tiers": [{"name": "high", "rules": {...}}, ...]}}, best tier
     * first. The order is the array's: an object of tiers is refused (JSON does not order an
     * object's keys), and so is any rule this client does not know, a tier listed twice, a null
     * rule, or a last tier that is not a catch-all.
     *
     * @throws IllegalArgumentException the text is not such a file (a build-time asset: a bug)
     */
    @Nonnull
    public static Tiers fromJson(@Nonnull String json) {
        return fromJson(dev.edgereg.internal.Codec.utf8(json));
    }

    /** {@link #fromJson(String)} on the file's bytes. */
    @Nonnull
    @SuppressWarnings("unchecked")
    public static Tiers fromJson(@Nonnull byte[] data) {
        if (data.length > MAX_FILE_BYTES) throw new IllegalArgumentException("the tier file is " + data.length + " bytes, more than " + MAX_FILE_BYTES);
        Object parsed;
        try {
            parsed = Json.parse(data);
        } catch (Json.JsonException e) {
            throw new IllegalArgumentException("the tier file is not strict JSON: " + e.getMessage());
        }
        if (!(parsed instanceof Map) || !(((Map<String, Object>) parsed).get("tiers") instanceof List)) {
            throw new IllegalArgumentException("the tier file must be {\"schema_version\": 1, \"tiers\": [{\"name\", \"rules\"}, ...]}, "
                    + "best first (export it with `edgereg tiers`; an object of tiers is refused: JSON does not order keys)");
        }
        Map<String, Object> doc = (Map<String, Object>) parsed;
        Object version = doc.get("schema_version");
        if (!(version instanceof Json.Num) || !Long.valueOf(1).equals(((Json.Num) version).longValue())) {
            throw new IllegalArgumentException("the tier file's schema_version is " + version + "; this client reads 1");
        }
        for (String key : doc.keySet()) {
            if (!key.equals("schema_version") && !key.equals("tiers")) throw new IllegalArgumentException("the tier file has an unknown key '" + key + "'");
        }
        List<Object> listed = (List<Object>) doc.get("tiers");
        if (listed.isEmpty() || listed.size() > MAX_TIERS) throw new IllegalArgumentException("the tier file must list 1 to " + MAX_TIERS + " tiers");
        LinkedHashMap<String, Rules.TierRules> out = new LinkedHashMap<String, Rules.TierRules>();
        Rules.TierRules last = null;
        String lastName = null;
        for (int i = 0; i < listed.size(); i++) {
            String where = "tiers[" + i + "]";
            if (!(listed.get(i) instanceof Map)) throw new IllegalArgumentException(where + " must be {\"name\", \"rules\"}");
            Map<String, Object> tier = (Map<String, Object>) listed.get(i);
            if (tier.size() != 2 || !tier.containsKey("name") || !(tier.get("rules") instanceof Map)) {
                throw new IllegalArgumentException(where + " must be {\"name\", \"rules\": {...}}");
            }
            Object name = tier.get("name");
            if (!(name instanceof String) || !NAME.matcher((String) name).matches()) throw new IllegalArgumentException(where + ": " + name + " is not a tier name");
            if (out.containsKey(name)) throw new IllegalArgumentException(where + ": tier '" + name + "' is listed twice");
            last = strictRules(where + " (" + name + ")", (Map<String, Object>) tier.get("rules"));
            lastName = (String) name;
            out.put(lastName, last);
        }
        if (last.minRamMb != null || last.minCpuCores != null || last.socAllow != null || last.os != null) {
            throw new IllegalArgumentException("the last tier, '" + lastName + "', sets rules: the last tier must be a catch-all");
        }
        return new Tiers(out);
    }

    static final int MAX_FILE_BYTES = 64 * 1024;
    static final int MAX_TIERS = 64;
    private static final java.util.regex.Pattern NAME = java.util.regex.Pattern.compile("[a-z][a-z0-9_-]{0,62}");
    private static final long MAX_SAFE_INTEGER = 9007199254740991L;

    private static Rules.TierRules strictRules(String where, Map<String, Object> r) {
        for (String key : r.keySet()) {
            if (!key.equals("min_ram_mb") && !key.equals("min_cpu_cores") && !key.equals("soc_allow") && !key.equals("os")) {
                throw new IllegalArgumentException(where + ": unknown rule '" + key + "' (a newer tier file raises schema_version)");
            }
        }
        Long ram = strictInt(where, r, "min_ram_mb", 0);
        Long cores = strictInt(where, r, "min_cpu_cores", 1);
        List<String> soc = strictStrings(where, r, "soc_allow");
        List<String> os = strictStrings(where, r, "os");
        if (os != null) {
            for (String o : os) if (!o.equals("android") && !o.equals("ios")) throw new IllegalArgumentException(where + ": os may hold android and ios only");
        }
        return new Rules.TierRules(ram, cores, soc, os);
    }

    private static Long strictInt(String where, Map<String, Object> r, String key, long low) {
        if (!r.containsKey(key)) return null;
        Object v = r.get(key);
        Long n = v instanceof Json.Num ? ((Json.Num) v).longValue() : null;
        if (n == null || n < low || n > MAX_SAFE_INTEGER) throw new IllegalArgumentException(where + ": " + key + " must be an integer from " + low + ", got " + v);
        return n;
    }

    private static List<String> strictStrings(String where, Map<String, Object> r, String key) {
        if (!r.containsKey(key)) return null;
        Object v = r.get(key);
        if (!(v instanceof List)) throw new IllegalArgumentException(where + ": " + key + " must be a list of strings");
        List<String> out = new ArrayList<String>();
        for (Object o : (List<?>) v) {
            if (!(o instanceof String)) throw new IllegalArgumentException(where + ": " + key + " must be a list of strings");
            out.add((String) o);
        }
        return Collections.unmodifiableList(out);
    }

    /** The tier names, best first. */
    @Nonnull public List<String> names() { return new ArrayList<String>(rules.keySet()); }

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
