package dev.edgereg;

import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import javax.annotation.Nonnull;
import javax.annotation.Nullable;

/**
 * A release shipped inside the app for the first, offline launch (docs/protocol.md section 10):
 * the manifest envelope bytes as served and a way to open its blobs by sha256 (a folder, or the
 * APK's assets via {@code AssetManager.open}). Verified like a fetched manifest except its expiry.
 */
public abstract class BundledRelease {
    @Nonnull
    public abstract byte[] manifest() throws IOException;

    /** The blob with this digest, or null when the app does not ship it. */
    @Nullable
    public abstract InputStream openBlob(@Nonnull String sha256) throws IOException;

    /** Opens a shipped blob by its sha256 (an APK asset: {@code assets.open("models/blobs/" + sha256)}). */
    public interface BlobOpener {
        /** The blob, or null (or a FileNotFoundException) when the app does not ship it. */
        @Nullable
        InputStream open(@Nonnull String sha256) throws IOException;
    }

    /**
     * The manifest envelope bytes as served, and a way to open the blobs. Kotlin:
     * {@code BundledRelease.of(assets.open("models/manifest.json").readBytes()) { assets.open("models/blobs/$it") }}
     */
    @Nonnull
    public static BundledRelease of(@Nonnull final byte[] manifest, @Nonnull final BlobOpener blobs) {
        final byte[] copy = manifest.clone();
        return new BundledRelease() {
            @Override public byte[] manifest() {
                return copy.clone();
            }

            @Override public InputStream openBlob(String sha256) throws IOException {
                try {
                    return blobs.open(sha256);
                } catch (java.io.FileNotFoundException e) {
                    return null;
                }
            }
        };
    }

    /** A manifest file beside a folder of blobs named by their hex digest. */
    @Nonnull
    public static BundledRelease fromFiles(@Nonnull final File manifest, @Nonnull final File blobsDir) {
        return new BundledRelease() {
            @Override public byte[] manifest() throws IOException {
                return dev.edgereg.internal.Store.readAll(manifest, 64 * 1024 + 1);
            }

            @Override public InputStream openBlob(String sha256) throws IOException {
                File f = new File(blobsDir, sha256);
                return f.isFile() ? new java.io.FileInputStream(f) : null;
            }
        };
    }
}
