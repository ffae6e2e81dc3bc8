// Apache Avro's reference implementation (Java) against denorm's wire
// contract, run by tests/it/interop.rs:
//
//   java DenormInterop fingerprints SCHEMA_FILE...   JSON of the wire fingerprints
//   java DenormInterop encode SCHEMAS_DIR PREFIX     `key<TAB>hex` lines, one per command
//
// Messages are written by Avro's own single-object encoder
// (BinaryMessageEncoder); another client sends the lines (Python, here).
import java.io.File;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.message.BinaryMessageEncoder;

public class DenormInterop {
  static String hex(byte[] b) {
    StringBuilder s = new StringBuilder();
    for (byte x : b) s.append(String.format("%02x", x));
    return s.toString();
  }

  /** The 8 bytes after C3 01: parsingFingerprint64, little-endian. */
  static String wireFingerprint(Schema s) {
    long fp = SchemaNormalization.parsingFingerprint64(s);
    byte[] b = new byte[8];
    for (int i = 0; i < 8; i++) b[i] = (byte) (fp >>> (8 * i));
    return hex(b);
  }

  static GenericRecord payload(Schema command, String op, String... kv) {
    Schema union = command.getField("payload").schema();
    GenericRecord r = new GenericData.Record(union.getTypes().get(union.getIndexNamed("denorm." + op)));
    for (int i = 0; i < kv.length; i += 2) r.put(kv[i], kv[i + 1]);
    return r;
  }

  /** The ordering key: top-level directory for files, user id otherwise. */
  static String key(GenericRecord p) {
    switch (p.getSchema().getName()) {
      case "UpsertFile": case "DeleteFile": return "/" + p.get("path").toString().split("/")[1];
      case "RenamePath": return "/" + p.get("from").toString().split("/")[1];
      case "UpsertUser": case "DeleteUser": return p.get("id").toString();
      default: return p.get("user_id").toString();
    }
  }

  public static void main(String[] args) throws Exception {
    if (args[0].equals("fingerprints")) {
      List<String> parts = new ArrayList<>();
      for (int i = 1; i < args.length; i++) {
        Schema s = new Schema.Parser().parse(new File(args[i]));
        parts.add("\"" + args[i] + "\":\"" + wireFingerprint(s) + "\"");
      }
      System.out.println("{" + String.join(",", parts) + "}");
      return;
    }
    Schema command = new Schema.Parser().parse(new File(args[1] + "/command.avsc"));
    String p = args[2], d = "/" + p, u = p + "-u1", u2 = p + "-u2", u3 = p + "-u3";
    List<GenericRecord> payloads = List.of(
        payload(command, "UpsertFile", "id", p + "-f1", "path", d + "/docs/a.txt", "contents", "alpha from " + p),
        payload(command, "UpsertFile", "id", p + "-f2", "path", d + "/docs/sub/b.txt", "contents", "beta"),
        payload(command, "RenamePath", "from", d + "/docs", "to", d + "/papers"),
        payload(command, "DeleteFile", "id", p + "-f2", "path", d + "/papers/sub/b.txt"),
        payload(command, "UpsertUser", "id", u, "name", "Ada Before", "email", "ada@example.com", "dob", "1815-12-10"),
        payload(command, "UpsertPost", "id", p + "-p1", "user_id", u, "title", "Notes", "body", "on the engine"),
        payload(command, "UpsertPost", "id", p + "-p2", "user_id", u, "title", "Draft", "body", "to delete"),
        payload(command, "DeletePost", "id", p + "-p2", "user_id", u),
        payload(command, "UpsertUser", "id", u, "name", "Ada " + p + " After", "email", "ada@example.com", "dob", "1815-12-10"),
        // An owner change: p1 goes to another user, in its two halves.
        payload(command, "UpsertUser", "id", u2, "name", "Grace " + p, "email", "grace@example.com", "dob", "1906-12-09"),
        payload(command, "DeletePost", "id", p + "-p1", "user_id", u),
        payload(command, "UpsertPost", "id", p + "-p1", "user_id", u2, "title", "Notes", "body", "on the engine", "previous_user_id", u),
        // And f1 to another top-level directory.
        payload(command, "DeleteFile", "id", p + "-f1", "path", d + "/papers/a.txt"),
        payload(command, "UpsertFile", "id", p + "-f1", "path", d + "-b/a.txt", "contents", "moved", "previous_path", d + "/papers/a.txt"),
        // A user deleted (version 7): a post sent after has no author name.
        payload(command, "UpsertUser", "id", u3, "name", "Gone", "email", "gone@example.com", "dob", "1900-01-01"),
        payload(command, "DeleteUser", "id", u3),
        payload(command, "UpsertPost", "id", p + "-p4", "user_id", u3, "title", "Orphan", "body", "after the delete"));
    BinaryMessageEncoder<GenericRecord> encoder = new BinaryMessageEncoder<>(GenericData.get(), command);
    for (GenericRecord payload : payloads) {
      GenericRecord c = new GenericData.Record(command);
      c.put("command_id", UUID.randomUUID().toString());
      c.put("issued_at", System.currentTimeMillis());
      c.put("tenant", null);
      c.put("payload", payload);
      ByteBuffer b = encoder.encode(c);
      byte[] bytes = new byte[b.remaining()];
      b.get(bytes);
      System.out.println(key(payload) + "\t" + hex(bytes));
    }
  }
}
