#!/bin/sh
# Android fit: every JDK class the library jar references must exist on Android 7.0 (API 24).
# jdeps lists the referenced JDK classes; the check refuses any in a package or class API 24 lacks.
# Source of the list: the Android API reference (developer.android.com/reference, "Added in API
# level N" on each class): java.nio.file (API 26), java.time (26), java.util.Base64 (26),
# java.lang.invoke.MethodHandles.Lookup APIs used by lambdas' indy (desugared by D8 anyway),
# java.net.http (never), java.lang.ProcessHandle (never), java.util.concurrent.Flow (never),
# javax.annotation.processing / javax.lang.model / java.lang.module (never), java.lang.StackWalker (never),
# java.lang.Runtime.Version (never).
set -eu
jar="$1"
out=$(jdeps -verbose:class --multi-release 17 -cp /usr/share/java/jsr305.jar "$jar" | awk '/->/ {print $3}' | grep -E '^(java|javax)\.' | sort -u)
echo "$out" > "$(dirname "$jar")/jdk-classes.txt"
echo "$(echo "$out" | wc -l) JDK classes referenced (list: $(dirname "$jar")/jdk-classes.txt)"
missing=$(echo "$out" | grep -E '^(java\.nio\.file\.|java\.time\.|java\.net\.http\.|java\.util\.Base64|java\.lang\.ProcessHandle|java\.util\.concurrent\.Flow|java\.lang\.StackWalker|java\.lang\.Runtime\$Version|java\.lang\.module\.|javax\.lang\.model\.|javax\.annotation\.processing\.|java\.lang\.invoke\.VarHandle|java\.util\.Optional|java\.util\.function\.|java\.util\.stream\.|java\.lang\.invoke\.StringConcatFactory)' || true)
# javax.annotation.Nonnull/Nullable are compile-only (jsr305), CLASS use only: not needed at run time.
if [ -n "$missing" ]; then
  echo "classes Android 7.0 (API 24) lacks:"; echo "$missing"; exit 1
fi
echo "API 24 fit: OK (no java.nio.file, java.time, java.util.Base64, java.net.http, streams, Optional)"
