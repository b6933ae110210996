package dev.edgereg.internal;

import java.io.File;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;

/**
 * The CPU features fit rule (e) reads and the coarse class reports carry (docs/protocol.md
 * sections 7 and 11). On Linux and Android the kernel lists its hwcap names on the
 * {@code Features} lines of /proc/cpuinfo; the table below maps them to the protocol's names.
 */
public final class CpuFeatures {
    private CpuFeatures() {}

    /** Linux hwcap name to the protocol's feature name (docs/protocol.md section 7's table). */
    static final Map<String, String> HWCAP;

    static {
        Map<String, String> m = new LinkedHashMap<String, String>();
        m.put("asimddp", "dotprod");
        m.put("asimdhp", "fp16");
        m.put("fphp", "fp16");
        m.put("i8mm", "i8mm");
        m.put("bf16", "bf16");
        m.put("sve2", "sve2");
        m.put("sme", "sme");
        HWCAP = Collections.unmodifiableMap(m);
    }

    private static final Object LOCK = new Object();
    private static boolean detected;
    private static Set<String> cached;

    public static boolean isName(String name) {
        return Wire.CPU_FEATURE.matcher(name).matches();
    }

    static boolean isArm64(String arch) {
        String a = arch == null ? "" : arch.toLowerCase(java.util.Locale.ROOT);
        return a.equals("aarch64") || a.equals("arm64");
    }

    static boolean isX86_64(String arch) {
        String a = arch == null ? "" : arch.toLowerCase(java.util.Locale.ROOT);
        return a.equals("x86_64") || a.equals("amd64");
    }

    static boolean isArm(String arch) {
        String a = arch == null ? "" : arch.toLowerCase(java.util.Locale.ROOT);
        return isArm64(a) || a.startsWith("arm");
    }

    /** This device's features (read once per process), or null when they cannot be read. */
    public static Set<String> detect() {
        synchronized (LOCK) {
            if (!detected) {
                cached = detect(System.getProperty("os.arch"), new File("/proc/cpuinfo"));
                detected = true;
            }
            return cached;
        }
    }

    /**
     * The features of a machine: the empty set on x86_64 (no ARM feature applies), the
     * {@code Features} lines of {@code cpuinfo} on aarch64, and null (not said, never "none")
     * anywhere else or when the file cannot be read or lists no features.
     */
    public static Set<String> detect(String arch, File cpuinfo) {
        if (isX86_64(arch)) return Collections.emptySet();
        if (!isArm64(arch)) return null;
        String text;
        try {
            text = Codec.utf8(readSmall(cpuinfo));
        } catch (IOException | RuntimeException e) {
            return null; // /proc hidden (a sandbox), or not Linux: unknown
        }
        return fromCpuinfo(text);
    }

    /** The protocol's names on the Features lines of a /proc/cpuinfo text (every core's, united), or null without such a line. */
    public static Set<String> fromCpuinfo(String text) {
        Set<String> found = null;
        for (String line : text.split("\n")) {
            int colon = line.indexOf(':');
            if (colon < 0 || !line.substring(0, colon).trim().equalsIgnoreCase("features")) continue;
            if (found == null) found = new TreeSet<String>();
            for (String word : line.substring(colon + 1).trim().split("\\s+")) {
                String name = HWCAP.get(word);
                if (name != null) found.add(name);
            }
        }
        return found;
    }

    /**
     * The coarse class a report carries, never the features: {@code armv9} with i8mm or sve2,
     * {@code armv8.2} with dotprod or fp16, else {@code armv8} on ARM (a set naming an ARM
     * feature is an ARM CPU's), {@code x86_64} on x86_64, {@code other} otherwise; null when the
     * features were not said.
     */
    public static String cpuClass(Set<String> features, String arch) {
        if (features == null) return null;
        if (features.contains("i8mm") || features.contains("sve2")) return "armv9";
        if (features.contains("dotprod") || features.contains("fp16")) return "armv8.2";
        boolean armFeature = false;
        for (String f : features) armFeature |= HWCAP.containsValue(f);
        if (armFeature || isArm(arch)) return "armv8";
        if (isX86_64(arch)) return "x86_64";
        return "other";
    }

    private static byte[] readSmall(File f) throws IOException {
        // /proc files report length 0: read to the end, bounded.
        InputStream in = new FileInputStream(f);
        try {
            java.io.ByteArrayOutputStream out = new java.io.ByteArrayOutputStream();
            byte[] buf = new byte[8192];
            int n;
            while ((n = in.read(buf)) > 0 && out.size() < (1 << 20)) out.write(buf, 0, n);
            return out.toByteArray();
        } finally {
            in.close();
        }
    }
}
