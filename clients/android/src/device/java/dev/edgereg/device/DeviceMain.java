package dev.edgereg.device;

import dev.edgereg.internal.Codec;
import dev.edgereg.internal.Conformance;
import dev.edgereg.internal.Ed25519;
import dev.edgereg.internal.Json;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.util.LinkedHashMap;
import java.util.Map;

/** The device program (docs/reference/device-program.md): one JSON object per line in and out. */
public final class DeviceMain {
    private DeviceMain() {}

    public static void main(String[] args) throws Exception {
        PrintStream out = new PrintStream(System.out, false, "UTF-8");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, "UTF-8"));
        Device device = new Device();
        String line;
        while ((line = in.readLine()) != null) {
            if (line.trim().isEmpty()) continue;
            Map<String, Object> response = new LinkedHashMap<String, Object>();
            Object id = Json.NULL;
            boolean quit = false;
            try {
                Object parsed = Json.parse(line);
                if (!(parsed instanceof Map)) throw new Misuse("a request is a JSON object");
                @SuppressWarnings("unchecked")
                Map<String, Object> request = (Map<String, Object>) parsed;
                if (request.containsKey("id")) id = request.get("id");
                Object op = request.get("op");
                if (!(op instanceof String)) throw new Misuse("missing 'op'");
                quit = "quit".equals(op);
                Map<String, Object> result = device.handle((String) op, request);
                response.put("id", id);
                response.put("ok", true);
                response.put("result", result);
            } catch (Misuse | Json.JsonException | IllegalArgumentException | ClassCastException | NullPointerException e) {
                response.put("id", id);
                response.put("ok", false);
                Map<String, Object> error = new LinkedHashMap<String, Object>();
                error.put("message", String.valueOf(e.getMessage() == null ? e.toString() : e.getMessage()));
                response.put("error", error);
            }
            out.print(Json.canonicalString(response));
            out.print('\n');
            out.flush();
            if (quit) break;
        }
        device.close();
        out.flush();
        System.exit(0);
    }

    /** Misuse of the harness itself: an unknown op, a missing argument. */
    static final class Misuse extends Exception {
        private static final long serialVersionUID = 1L;

        Misuse(String message) { super(message); }
    }

    static final class Device {
        Map<String, Object> handle(String op, Map<String, Object> request) throws Misuse {
            Map<String, Object> result = new LinkedHashMap<String, Object>();
            if (op.equals("hello")) {
                result.put("client", "jvm");
                result.put("sdk_version", dev.edgereg.EdgeregClient.SDK_VERSION);
            } else if (op.equals("decide")) {
                result = Conformance.decide(object(request, "vector"), Ed25519.best());
            } else if (op.equals("check_blob")) {
                result = Conformance.checkBlob(object(request, "vector"));
            } else if (op.equals("check_json")) {
                Object data = request.get("data");
                if (!(data instanceof String)) throw new Misuse("check_json needs 'data' (base64)");
                byte[] bytes = Codec.base64Decode((String) data);
                if (bytes == null) throw new Misuse("'data' is not canonical base64");
                result.put("valid", Json.isValid(bytes));
            } else if (op.equals("quit")) {
                // answered, then the loop ends
            } else {
                throw new Misuse("unknown op '" + op + "'");
            }
            return result;
        }

        void close() {}

        @SuppressWarnings("unchecked")
        static Map<String, Object> object(Map<String, Object> request, String key) throws Misuse {
            Object v = request.get(key);
            if (!(v instanceof Map)) throw new Misuse("missing object '" + key + "'");
            return (Map<String, Object>) v;
        }
    }
}
