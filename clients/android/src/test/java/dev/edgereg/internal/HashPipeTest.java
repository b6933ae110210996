package dev.edgereg.internal;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.file.Files;
import java.security.MessageDigest;
import java.util.Random;
import org.junit.jupiter.api.Test;

/** The digest that follows a file as it is written (the download path's HashPipe). */
class HashPipeTest {
    private static File temp(String name) throws IOException {
        File dir = Files.createTempDirectory("hashpipe").toFile();
        dir.deleteOnExit();
        File f = new File(dir, name);
        f.deleteOnExit();
        return f;
    }

    private static byte[] random(int n, long seed) {
        byte[] b = new byte[n];
        new Random(seed).nextBytes(b);
        return b;
    }

    private static String sha(byte[]... parts) {
        MessageDigest d = Codec.sha256();
        for (byte[] p : parts) d.update(p);
        return Codec.hex(d.digest());
    }

    private static void await(HashPipe pipe, HashPipe.Job job) throws Exception {
        long until = System.currentTimeMillis() + 30_000;
        while (!pipe.await(job, 100)) assertTrue(System.currentTimeMillis() < until, "the digest never caught up");
    }

    @Test
    void filesHashedBehindTheWriterInOrderWithAResumedPart() throws Exception {
        byte[] resumed = random(70_000, 1);
        byte[] rest = random(1_000_003, 2);
        byte[] other = random(200_000, 3);
        File a = temp("a.part");
        File b = temp("b.part");
        // a: a resumed part already in its digest, then appended in uneven writes.
        Files.write(a.toPath(), resumed);
        MessageDigest da = Codec.sha256();
        da.update(resumed);
        MessageDigest db = Codec.sha256();
        HashPipe pipe = new HashPipe();
        try {
            HashPipe.Job ja = pipe.add(da, a, resumed.length);
            HashPipe.Job jb = pipe.add(db, b, 0);
            FileOutputStream out = new FileOutputStream(a, true);
            for (int off = 0, n = 1; off < rest.length; off += n, n = Math.min(rest.length - off, n * 3 + 7)) {
                out.write(rest, off, Math.min(n, rest.length - off));
                ja.wrote(Math.min(n, rest.length - off));
            }
            out.close();
            assertFalse(ja.finished(), "finished before the writer closed it");
            ja.closed();
            out = new FileOutputStream(b);
            out.write(other);
            jb.wrote(other.length);
            out.close();
            jb.closed();
            await(pipe, jb); // the later one: the earlier is done first
            assertTrue(ja.finished());
            await(pipe, ja);
            assertEquals(sha(resumed, rest), Codec.hex(da.digest()));
            assertEquals(sha(other), Codec.hex(db.digest()));
        } finally {
            pipe.close();
        }
    }

    @Test
    void waitsForTheWriterAndReportsAFileCutShort() throws Exception {
        File a = temp("short.part");
        byte[] data = random(100_000, 4);
        Files.write(a.toPath(), data);
        HashPipe pipe = new HashPipe();
        try {
            HashPipe.Job job = pipe.add(Codec.sha256(), a, 0);
            job.wrote(data.length);
            assertFalse(pipe.await(job, 50), "done before the writer closed it");
            // The file loses bytes the writer said it wrote: the job fails, it does not hang.
            RandomAccessFile f = new RandomAccessFile(a, "rw");
            f.setLength(10);
            f.close();
            job.wrote(5);
            job.closed();
            long until = System.currentTimeMillis() + 30_000;
            IOException thrown = assertThrows(IOException.class, () -> {
                while (!pipe.await(job, 100)) assertTrue(System.currentTimeMillis() < until, "never failed");
            });
            assertTrue(thrown.getMessage().contains("ended before"), thrown.getMessage());
        } finally {
            pipe.close();
        }
    }

    @Test
    void closeIsIdempotentAndRefusesMoreWork() throws Exception {
        HashPipe pipe = new HashPipe();
        HashPipe.Job job = pipe.add(Codec.sha256(), temp("never.part"), 0);
        pipe.close();
        pipe.close();
        assertThrows(IllegalStateException.class, () -> pipe.await(job, 10));
        assertThrows(IllegalStateException.class, () -> pipe.add(Codec.sha256(), temp("late.part"), 0));
    }
}
