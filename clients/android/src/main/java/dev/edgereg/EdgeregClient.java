package dev.edgereg;

public final class EdgeregClient {
    public static final String SDK_VERSION = "0.2.0";
}
