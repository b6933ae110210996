package dev.edgereg.tools;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.jar.JarEntry;
import java.util.jar.JarOutputStream;
import javax.tools.JavaCompiler;
import javax.tools.ToolProvider;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The API 24 allow-list check against real class files: javac --release 8 (as the library is
 * built) compiles small classes that call what Android added after API 24, the check must
 * name each; what API 24 has, reached directly or through inheritance, passes; the shipped
 * jar passes.
 */
class ApiCheckTest {
    static final File TABLE = new File("api/android-24.txt");
    static ApiCheck check;
    @TempDir File tmp;

    @BeforeAll
    static void readTable() throws IOException {
        check = ApiCheck.readTable(TABLE);
    }

    /** Compiles the sources (name, text) with --release 8 and packs them into a jar. */
    File jarOf(String... sources) throws IOException {
        File src = new File(tmp, "src");
        File out = new File(tmp, "classes");
        assertTrue(src.mkdirs() && out.mkdirs());
        List<String> args = new ArrayList<>(Arrays.asList("--release", "8", "-nowarn", "-d", out.getPath()));
        for (int i = 0; i < sources.length; i += 2) {
            File f = new File(src, sources[i] + ".java");
            Files.write(f.toPath(), sources[i + 1].getBytes(StandardCharsets.UTF_8));
            args.add(f.getPath());
        }
        JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
        ByteArrayOutputStream err = new ByteArrayOutputStream();
        int rc = javac.run(null, null, new PrintStream(err, true, "UTF-8"), args.toArray(new String[0]));
        assertEquals(0, rc, err.toString("UTF-8"));
        File jar = new File(tmp, "fixture.jar");
        try (JarOutputStream j = new JarOutputStream(new FileOutputStream(jar))) {
            File[] classes = out.listFiles();
            Arrays.sort(classes);
            for (File c : classes) {
                j.putNextEntry(new JarEntry(c.getName()));
                j.write(Files.readAllBytes(c.toPath()));
                j.closeEntry();
            }
        }
        return jar;
    }

    ApiCheck.Result run(File jar) throws IOException {
        return check.check(Collections.singletonList(jar));
    }

    @Test
    void tableSaysWhereItComesFrom() throws IOException {
        String head = new String(Files.readAllBytes(TABLE.toPath()), StandardCharsets.UTF_8).substring(0, 2000);
        assertTrue(head.contains("24/public/api/android.txt"), head);
        assertTrue(head.contains("sha256 67306044b2163c866d8573c2b4bd8d12b8231ade7e3795ced2378f131479ac1e"), head);
        assertTrue(head.contains("generate.py"), head);
    }

    @Test
    void unsignedHelpersOfApi26Fail() throws IOException {
        ApiCheck.Result r = run(jarOf("Unsigned",
            "class Unsigned { long f(int i, long a, long b, byte x) {"
            + " return Integer.toUnsignedLong(i) + Long.compareUnsigned(a, b) + Byte.toUnsignedInt(x); } }"));
        assertFalse(r.ok());
        assertEquals(
            Arrays.asList("java/lang/Byte.toUnsignedInt(B)I", "java/lang/Integer.toUnsignedLong(I)J",
                "java/lang/Long.compareUnsigned(JJ)I"),
            new ArrayList<>(r.missing.keySet()));
        assertEquals(Collections.singleton("Unsigned"), r.missing.get("java/lang/Integer.toUnsignedLong(I)J"));
    }

    @Test
    void classesOfApi26Fail() throws IOException {
        ApiCheck.Result r = run(jarOf("Io",
            "class Io { byte[] f(java.io.File f) throws java.io.IOException {"
            + " return java.util.Base64.getEncoder().encode(java.nio.file.Files.readAllBytes(f.toPath())); } }"));
        assertTrue(r.missing.containsKey("class java/util/Base64"), r.missing.toString());
        assertTrue(r.missing.containsKey("class java/nio/file/Files"), r.missing.toString());
        assertTrue(r.missing.containsKey("class java/nio/file/Path"), r.missing.toString());
        assertTrue(r.missing.containsKey("java/io/File.toPath()Ljava/nio/file/Path;"), r.missing.toString());
        assertTrue(r.missing.containsKey("java/util/Base64.getEncoder()Ljava/util/Base64$Encoder;"), r.missing.toString());
    }

    @Test
    void membersOfApi26OnOldClassesFail() throws IOException {
        // String.join and ThreadLocal.withInitial: Java 8, Android 26. The second is reached
        // through the fixture's own subclass, so resolution has to walk to the JDK class.
        ApiCheck.Result r = run(jarOf("Old",
            "class Old { static class Local extends ThreadLocal<String> {}"
            + " Object f() { return String.join(\",\", \"a\", \"b\") + Local.withInitial("
            + " new java.util.function.Supplier<String>() { public String get() { return \"x\"; } }); } }"));
        assertTrue(r.missing.containsKey("java/lang/String.join(Ljava/lang/CharSequence;[Ljava/lang/CharSequence;)Ljava/lang/String;"),
            r.missing.toString());
        assertTrue(r.missing.containsKey("Old$Local.withInitial(Ljava/util/function/Supplier;)Ljava/lang/ThreadLocal;"),
            r.missing.toString());
        assertEquals(2, r.missing.size(), r.missing.toString());
    }

    @Test
    void aLambdaNeedsLambdaMetafactoryWhichApi24LacksWithoutDesugaring() throws IOException {
        ApiCheck.Result r = run(jarOf("Lambda",
            "class Lambda { Runnable f() { return () -> {}; } }"));
        assertTrue(r.missing.containsKey("class java/lang/invoke/LambdaMetafactory"), r.missing.toString());
    }

    @Test
    void whatApi24HasPassesDirectlyAndThroughInheritance() throws IOException {
        // ArrayList declares neither add nor stream in the signature file: add comes from
        // AbstractList, stream from Collection (a default method of API 24); CompletableFuture,
        // Optional and java.util.function are API 24; hashCode on an interface is Object's.
        ApiCheck.Result r = run(jarOf("Fits",
            "import java.util.*; import java.util.concurrent.*;"
            + " class Fits extends ArrayList<String> {"
            + "  long f(List<String> l) { add(\"a\"); l.hashCode();"
            + "   CompletableFuture<String> c = CompletableFuture.completedFuture(\"x\");"
            + "   Optional<String> o = Optional.ofNullable(c.getNow(null));"
            + "   return stream().count() + l.size() + (o.isPresent() ? 1 : 0) + Integer.compare(1, 2)"
            + "    + new StringBuilder().append(1).append(\"s\").length() + TimeUnit.SECONDS.toMillis(1)"
            + "    + Arrays.asList(TimeUnit.values()).size() + System.currentTimeMillis(); } }"));
        assertTrue(r.ok(), r.missing.toString());
        assertTrue(r.externalMembers >= 10, "members counted: " + r.externalMembers);
    }

    @Test
    void theLibraryJarFits() throws IOException {
        File[] jars = new File("build").listFiles((d, n) -> n.matches("edgereg-android-[\\d.]+\\.jar"));
        assertEquals(1, jars.length);
        ApiCheck.Result r = run(jars[0]);
        assertTrue(r.ok(), r.missing.toString());
        assertTrue(r.classesChecked > 50 && r.externalClasses > 50 && r.externalMembers > 200,
            r.classesChecked + " " + r.externalClasses + " " + r.externalMembers);
    }
}
