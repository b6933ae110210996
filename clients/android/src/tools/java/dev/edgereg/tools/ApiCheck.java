package dev.edgereg.tools;

import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.File;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.BufferedReader;
import java.io.ByteArrayInputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.zip.ZipEntry;
import java.util.zip.ZipInputStream;

/**
 * The Android API 24 fit of a jar, as an allow-list: every class the jar references that it does
 * not define, and every constructor, method and field it references on such a class (directly
 * or inherited through its own classes), must be in the table api/android-24.txt (generated from
 * AOSP's frozen API 24 signature file; provenance at its top). Walks each class file's constant
 * pool: Class entries, Fieldref/Methodref/InterfaceMethodref (members resolved through the
 * supertypes, as the JVM does; a MethodHandle names one of these), MethodType entries, and the
 * descriptors of the class's own fields and methods. Annotation types are not checked: ART and
 * the JVM skip an annotation whose type is absent (the JSR-305 names are compile-only).
 *
 * <p>Usage: {@code ApiCheck TABLE JAR...}; prints what it checked, and each reference the table
 * lacks with the classes that make it, and exits 1 when there is one.
 */
public final class ApiCheck {
    /** One class of the table or of the jar: supertypes and declared members. */
    static final class Type {
        final String name;
        final boolean isInterface;
        final List<String> supers = new ArrayList<>();
        final Set<String> members = new HashSet<>();

        Type(String name, boolean isInterface) {
            this.name = name;
            this.isInterface = isInterface;
        }
    }

    /** What one check found: the references the table lacks, each with the classes making it. */
    public static final class Result {
        public final int classesChecked;
        public final int externalClasses;
        public final int externalMembers;
        public final Map<String, Set<String>> missing;

        Result(int classesChecked, int externalClasses, int externalMembers, Map<String, Set<String>> missing) {
            this.classesChecked = classesChecked;
            this.externalClasses = externalClasses;
            this.externalMembers = externalMembers;
            this.missing = missing;
        }

        public boolean ok() {
            return missing.isEmpty();
        }
    }

    private final Map<String, Type> table;

    public ApiCheck(Map<String, Type> table) {
        this.table = table;
    }

    /** Reads api/android-24.txt's format (see its header). */
    public static ApiCheck readTable(File file) throws IOException {
        Map<String, Type> types = new HashMap<>();
        try (BufferedReader in = new BufferedReader(new InputStreamReader(new FileInputStream(file), StandardCharsets.UTF_8))) {
            Type current = null;
            String line;
            int number = 0;
            while ((line = in.readLine()) != null) {
                number++;
                if (line.isEmpty() || line.startsWith("#")) {
                    continue;
                }
                if (line.startsWith("  ")) {
                    if (current == null) {
                        throw new IOException(file + ":" + number + ": a member before any class");
                    }
                    current.members.add(line.trim());
                    continue;
                }
                String[] words = line.split(" ");
                if (words.length < 2 || !(words[0].equals("class") || words[0].equals("interface"))) {
                    throw new IOException(file + ":" + number + ": expected 'class NAME' or 'interface NAME': " + line);
                }
                current = new Type(words[1], words[0].equals("interface"));
                for (int i = 2; i < words.length; i++) {
                    if (!words[i].equals("extends") && !words[i].equals("implements")) {
                        current.supers.add(words[i]);
                    }
                }
                types.put(current.name, current);
            }
        }
        if (!types.containsKey("java/lang/Object")) {
            throw new IOException(file + ": no java/lang/Object: not an API table");
        }
        return new ApiCheck(types);
    }

    /** Checks every class file of the jars (the jars' own classes may reference each other). */
    public Result check(List<File> jars) throws IOException {
        Map<String, byte[]> files = new TreeMap<>();
        for (File jar : jars) {
            try (ZipInputStream zip = new ZipInputStream(new FileInputStream(jar))) {
                ZipEntry e;
                while ((e = zip.getNextEntry()) != null) {
                    if (e.getName().endsWith(".class") && !e.getName().startsWith("META-INF/")) {
                        files.put(jar.getName() + "!" + e.getName(), readAll(zip));
                    }
                }
            }
        }
        List<ClassFile> classes = new ArrayList<>();
        Map<String, Type> own = new HashMap<>();
        for (Map.Entry<String, byte[]> f : files.entrySet()) {
            ClassFile c = ClassFile.parse(f.getKey(), f.getValue());
            classes.add(c);
            own.put(c.self.name, c.self);
        }
        Map<String, Set<String>> missing = new TreeMap<>();
        Set<String> externalClasses = new TreeSet<>();
        Set<String> externalMembers = new TreeSet<>();
        for (ClassFile c : classes) {
            String user = c.self.name.replace('/', '.');
            for (String t : c.types) {
                if (own.containsKey(t)) {
                    continue;
                }
                externalClasses.add(t);
                if (!table.containsKey(t)) {
                    missing.computeIfAbsent("class " + t, k -> new TreeSet<>()).add(user);
                }
            }
            for (String[] ref : c.memberRefs) {
                String owner = ref[0].startsWith("[") ? "java/lang/Object" : ref[0];
                String member = ref[1];
                if (!own.containsKey(owner)) {
                    externalMembers.add(owner + "." + member);
                }
                if (!resolves(owner, member, own, new HashSet<>())) {
                    missing.computeIfAbsent(owner + "." + member, k -> new TreeSet<>()).add(user);
                }
            }
        }
        return new Result(classes.size(), externalClasses.size(), externalMembers.size(), missing);
    }

    /** JVM resolution (JVMS 5.4.3.3/5.4.3.4) over the jar's own classes and the table. */
    private boolean resolves(String owner, String member, Map<String, Type> own, Set<String> seen) {
        if (!seen.add(owner)) {
            return false;
        }
        Type t = own.containsKey(owner) ? own.get(owner) : table.get(owner);
        if (t == null) {
            return false;
        }
        if (t.members.contains(member)) {
            return true;
        }
        for (String s : t.supers) {
            if (resolves(s, member, own, seen)) {
                return true;
            }
        }
        return t.isInterface && !member.startsWith("<init>") && resolves("java/lang/Object", member, own, seen);
    }

    private static byte[] readAll(InputStream in) throws IOException {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        byte[] buf = new byte[8192];
        int n;
        while ((n = in.read(buf)) > 0) {
            out.write(buf, 0, n);
        }
        return out.toByteArray();
    }

    /** The parts of one class file the check needs. */
    static final class ClassFile {
        Type self;
        final Set<String> types = new TreeSet<>();
        final List<String[]> memberRefs = new ArrayList<>();
        private Object[] pool;
        private int[] tags;

        static ClassFile parse(String where, byte[] bytes) throws IOException {
            try {
                return new ClassFile().read(new DataInputStream(new ByteArrayInputStream(bytes)));
            } catch (IOException | RuntimeException e) {
                throw new IOException(where + ": not a class file this check reads: " + e, e);
            }
        }

        private ClassFile read(DataInputStream in) throws IOException {
            if (in.readInt() != 0xCAFEBABE) {
                throw new IOException("bad magic");
            }
            in.readUnsignedShort();
            in.readUnsignedShort();
            int count = in.readUnsignedShort();
            pool = new Object[count];
            tags = new int[count];
            for (int i = 1; i < count; i++) {
                int tag = in.readUnsignedByte();
                tags[i] = tag;
                switch (tag) {
                    case 1: pool[i] = in.readUTF(); break;
                    case 3: case 4: in.readInt(); break;
                    case 5: case 6: in.readLong(); i++; break;
                    case 7: case 8: case 16: case 19: case 20: pool[i] = new int[] {in.readUnsignedShort()}; break;
                    case 9: case 10: case 11: case 12: case 17: case 18:
                        pool[i] = new int[] {in.readUnsignedShort(), in.readUnsignedShort()};
                        break;
                    case 15: pool[i] = new int[] {in.readUnsignedByte(), in.readUnsignedShort()}; break;
                    default: throw new IOException("constant pool tag " + tag + " at " + i);
                }
            }
            int access = in.readUnsignedShort();
            self = new Type(className(in.readUnsignedShort()), (access & 0x0200) != 0);
            int superIndex = in.readUnsignedShort();
            if (superIndex != 0) {
                self.supers.add(className(superIndex));
            }
            int interfaces = in.readUnsignedShort();
            for (int i = 0; i < interfaces; i++) {
                self.supers.add(className(in.readUnsignedShort()));
            }
            for (int kind = 0; kind < 2; kind++) {  // fields, then methods
                int n = in.readUnsignedShort();
                for (int i = 0; i < n; i++) {
                    in.readUnsignedShort();
                    String name = utf(in.readUnsignedShort());
                    String desc = utf(in.readUnsignedShort());
                    self.members.add(kind == 0 ? name + ":" + desc : name + desc);
                    addDescriptor(desc);
                    attributes(in);
                }
            }
            attributes(in);
            for (int i = 1; i < pool.length; i++) {
                switch (tags[i]) {
                    case 7: {
                        String name = utf(((int[]) pool[i])[0]);
                        if (name.startsWith("[")) {
                            addDescriptor(name);
                        } else {
                            types.add(name);
                        }
                        break;
                    }
                    case 9: case 10: case 11: {
                        int[] ref = (int[]) pool[i];
                        int[] nat = (int[]) pool[ref[1]];
                        String name = utf(nat[0]);
                        String desc = utf(nat[1]);
                        memberRefs.add(new String[] {className(ref[0]), tags[i] == 9 ? name + ":" + desc : name + desc});
                        addDescriptor(desc);
                        break;
                    }
                    case 16: addDescriptor(utf(((int[]) pool[i])[0])); break;
                    default: break;
                }
            }
            types.remove(self.name);
            return this;
        }

        private String utf(int index) {
            return (String) pool[index];
        }

        private String className(int index) {
            return utf(((int[]) pool[index])[0]);
        }

        /** Every class a field or method descriptor names (JVMS 4.3). */
        private void addDescriptor(String desc) {
            for (int i = 0; i < desc.length(); i++) {
                if (desc.charAt(i) == 'L') {
                    int end = desc.indexOf(';', i);
                    types.add(desc.substring(i + 1, end));
                    i = end;
                }
            }
        }

        /** Skips attributes: annotations never load their types (see the class comment). */
        private void attributes(DataInputStream in) throws IOException {
            int n = in.readUnsignedShort();
            for (int i = 0; i < n; i++) {
                in.readUnsignedShort();
                in.skipBytes(in.readInt());
            }
        }
    }

    public static void main(String[] args) {
        if (args.length < 2) {
            System.err.println("usage: ApiCheck TABLE JAR...  (TABLE: api/android-24.txt)");
            System.exit(2);
        }
        try {
            ApiCheck check = readTable(new File(args[0]));
            List<File> jars = new ArrayList<>();
            for (int i = 1; i < args.length; i++) {
                jars.add(new File(args[i]));
            }
            Result r = check.check(jars);
            System.out.println(r.classesChecked + " classes checked: " + r.externalClasses + " JDK classes and "
                + r.externalMembers + " JDK members referenced, each looked up in " + args[0]);
            if (!r.ok()) {
                System.out.println("not in Android API 24 (" + r.missing.size() + "):");
                for (Map.Entry<String, Set<String>> m : r.missing.entrySet()) {
                    System.out.println("  " + m.getKey() + "  (used by " + String.join(", ", m.getValue()) + ")");
                }
                System.out.println("Use what API 24 has (the table lists it) or write the code yourself.");
                System.exit(1);
            }
            System.out.println("API 24 fit: OK");
        } catch (IOException e) {
            System.err.println("api-check: " + e.getMessage());
            System.exit(2);
        }
    }
}
