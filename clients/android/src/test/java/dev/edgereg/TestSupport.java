package dev.edgereg;

import dev.edgereg.internal.Ed25519;
import java.io.File;
import java.util.ArrayList;
import java.util.List;

final class TestSupport {
    private TestSupport() {}

    /** The repository root: EDGEREG_REPO, else the first parent holding tests/vectors. */
    static File repoRoot() {
        String env = System.getenv("EDGEREG_REPO");
        if (env != null) return new File(env);
        File dir = new File("").getAbsoluteFile();
        while (dir != null) {
            if (new File(dir, "tests/vectors").isDirectory()) return dir;
            dir = dir.getParentFile();
        }
        throw new IllegalStateException("tests/vectors not found above " + new File("").getAbsolutePath());
    }

    /** Both providers, each required: the suite must prove both verify. */
    static List<Ed25519> providers() {
        List<Ed25519> out = new ArrayList<Ed25519>();
        Ed25519 platform = Ed25519.platform();
        Ed25519 bc = Ed25519.bouncyCastle();
        if (platform == null) throw new IllegalStateException("the JDK has no Ed25519 (JDK 15+ needed for the tests)");
        if (bc == null) throw new IllegalStateException("BouncyCastle is not on the test class path");
        out.add(platform);
        out.add(bc);
        return out;
    }
}
