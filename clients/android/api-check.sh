#!/bin/sh
# Android fit: the library jar may reference only JDK classes and members Android 7.0 (API 24) has.
#
# 1. jdeps lists every JDK class the jar references (build/jdk-classes.txt); any class of a package
#    or a class API 24 lacks fails the check.
# 2. javap lists every JDK method and field the jar references (build/jdk-members.txt); any Java 8
#    member Android added after API 24 fails the check. (`javac --release 8` already keeps out
#    everything newer than Java 8, so only Java 8 APIs Android lacks at 24 can slip through.)
#
# Source of the lists: the Android API reference, developer.android.com/reference/packages, whose
# page for each class and member says "Added in API level N": java.nio.file, java.time,
# java.util.Base64, java.lang.invoke.MethodHandles.Lookup's findStatic & co. used by lambdas
# (we have none), String.join, ThreadLocal.withInitial and the java.lang.annotation.Repeatable
# family arrived in API 26; java.util.concurrent.Flow in 30; java.lang.invoke.VarHandle in 33;
# java.net.http, ProcessHandle, StackWalker, java.lang.module never (not part of Android).
# Member-level checking is a denylist of the Java 8 members known to be later than API 24, not a
# proof; build/jdk-members.txt is small enough (~250 lines) to review by eye.
set -eu
jar=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
dir=$(dirname "$jar")
classes=$(jdeps -verbose:class --multi-release 17 -cp "$dir/annotations" "$jar" | awk '/->/ {print $3}' | grep -E '^(java|javax)\.' | sort -u)
echo "$classes" > "$dir/jdk-classes.txt"
tmp=$(mktemp -d)
(cd "$tmp" && jar xf "$jar")
find "$tmp" -name '*.class' | xargs javap -c -p 2>/dev/null \
  | grep -oE '(Method|InterfaceMethod|Field) java/[A-Za-z0-9/$]+\.[A-Za-z0-9<>$_]+' | sed 's/^[A-Za-z]* //' | sort -u > "$dir/jdk-members.txt"
rm -rf "$tmp"
echo "$(echo "$classes" | wc -l) JDK classes, $(wc -l < "$dir/jdk-members.txt") JDK members referenced ($dir/jdk-classes.txt, $dir/jdk-members.txt)"
bad_classes=$(echo "$classes" | grep -E '^(java\.nio\.file\.|java\.time\.|java\.net\.http\.|java\.util\.Base64|java\.lang\.ProcessHandle|java\.util\.concurrent\.Flow|java\.lang\.StackWalker|java\.lang\.module\.|java\.lang\.invoke\.VarHandle|java\.lang\.invoke\.StringConcatFactory|java\.lang\.invoke\.LambdaMetafactory)' || true)
bad_members=$(grep -E '^(java/lang/String\.join|java/lang/ThreadLocal\.withInitial|java/lang/Integer\.toUnsignedString|java/lang/Long\.toUnsignedString|java/lang/Integer\.parseUnsignedInt|java/lang/Long\.parseUnsignedLong|java/util/Arrays\.parallel|java/lang/reflect/Method\.getParameters|java/lang/reflect/Executable\.getParameters|java/lang/Class\.getAnnotationsByType)' "$dir/jdk-members.txt" || true)
# javax.annotation.Nonnull/Nullable (jsr305) are compile-only annotations, absent at run time by design.
if [ -n "$bad_classes$bad_members" ]; then
  echo "references Android 7.0 (API 24) lacks:"; echo "$bad_classes"; echo "$bad_members"; exit 1
fi
echo "API 24 fit: OK"
