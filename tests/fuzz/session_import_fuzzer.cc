// libFuzzer target: importing a session. ImportSession takes bytes from a
// client and runs two decoders on them before any session exists:
// DecodeSessionExport (server/sessions/session_export.h: the envelope with format
// version, fingerprint, position, pending tokens and checksum) and
// LanguageModel::RestoreSession (the memory image inside it). Both must refuse
// damaged or hostile bytes with a status; a session they accept must be
// usable.
//
// Input: byte 0 % 3 picks the mode:
//   0: the rest is an export, as a client would send it;
//   1: the rest is a memory image (SessionState::AppendTo's bytes), wrapped
//      in an export with this model's fingerprint and a valid checksum (the
//      checksum is no secret: anyone can compute it);
//   2: a real session's image (made at start-up: window 8, 5 tokens fed), with
//      patches: repeated [2-byte little-endian offset][1-byte length][bytes],
//      then wrapped as in mode 1. Its 72-byte header holds the fields.
// Byte 1 of modes 1 and 2 (when there is one) sets the export's pending-token
// count (0-2; more than one is refused).
//
// Checked beyond "no crash, no sanitizer report": an export that decodes
// encodes back to the same bytes; refusals are INVALID_ARGUMENT (or
// RESOURCE_EXHAUSTED when the memory cannot be allocated); a restored session
// has the position and window its image states, at most mem_len - 1 tokens in
// memory, its own image restores to a session with the same image, and it
// runs a step of two tokens (position + 2).
// Mode 0's bytes also go to the session journal's two decoders of stored
// state (server/durability/session_journal.h): DecodeSessionMeta (OK or DATA_LOSS; what
// decodes encodes back to the same bytes) and ReplayJournalLog (OK or
// DATA_LOSS; what replays sets the history around the snapshot from the log
// alone, within [0, snapshot]; the log's valid prefix replays the same; a
// rewind's cut log (TruncateJournalLog) drops exactly the tokens after the cut).
// A broken property calls __builtin_trap(), which libFuzzer reports as a crash.
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "model/model_config.h"
#include "model/net/checkpoint.h"
#include "model/net/language_model.h"
#include "model/tokenizer.h"
#include "server/durability/session_journal.h"
#include "server/sessions/session_export.h"

namespace {

using namespace txl;

void Check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "session_import_fuzzer: property broken: %s\n", what.c_str());
    __builtin_trap();
  }
}

std::unique_ptr<LanguageModel> g_model;
std::string g_image;  // a real session's memory image

// The memory image's header: magic, then int64 n_layer, n_head, d_head, mem_len,
// position, length, capacity, element size (model/net/session_memory.cc).
int64_t HeaderField(const std::string& image, int i) {
  int64_t v;
  std::memcpy(&v, image.data() + 8 + 8 * i, 8);
  return v;
}

bool Refusal(const absl::Status& s) {
  return s.code() == absl::StatusCode::kInvalidArgument || s.code() == absl::StatusCode::kResourceExhausted;
}

void Restore(const std::string& state) {
  absl::StatusOr<std::unique_ptr<SessionState>> session = g_model->RestoreSession(state);
  if (!session.ok()) {
    Check(Refusal(session.status()), "RestoreSession refuses with INVALID_ARGUMENT or RESOURCE_EXHAUSTED: " +
                                         std::string(session.status().message()));
    return;
  }
  SessionState& s = **session;
  Check(state.size() >= 72, "an accepted image has a whole header");
  Check(s.mem_len() == HeaderField(state, 3) && s.position() == HeaderField(state, 4),
        "a restored session has the window and position of its image");
  Check(s.memory_tokens() >= 0 && s.memory_tokens() <= s.mem_len() - 1, "memory holds at most mem_len - 1 tokens");
  Check(s.memory_tokens() <= s.position(), "memory holds no more tokens than the history");

  // Its image restores again, to a session whose image is the same (fields an empty
  // memory does not use may differ from the input's).
  std::string again, twice;
  Check(s.AppendTo(&again).ok(), "a restored session's image can be taken");
  absl::StatusOr<std::unique_ptr<SessionState>> copy = g_model->RestoreSession(again);
  Check(copy.ok(), "a restored session's image restores");
  Check((*copy)->AppendTo(&twice).ok() && twice == again, "an image restores to the same image");
  Check((*copy)->position() == s.position() && (*copy)->mem_len() == s.mem_len(), "the copy has the same state");

  const int64_t before = s.position();
  StepInput input;
  input.session = &s;
  input.tokens = {1, 2};
  input.targets = {2};
  std::vector<StepInput> inputs = {input};
  absl::StatusOr<std::vector<StepOutput>> out = g_model->Step(absl::MakeSpan(inputs));
  if (!out.ok()) {
    Check(Refusal(out.status()),
          "a step on a restored session fails only with a status: " + std::string(out.status().message()));
    return;
  }
  Check(s.position() == before + 2, "a step of two tokens advances the position by two");
  Check(s.memory_tokens() <= s.mem_len() - 1, "memory stays within the window after a step");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  char dir[] = "/tmp/txl_session_import_fuzzer.XXXXXX";
  Check(mkdtemp(dir) != nullptr, "mkdtemp");
  const std::string path = std::string(dir) + "/m.pt";
  SetThreads(1);
  Tokenizer chars = *Tokenizer::CharFromCorpus("abcdefghijklmnopqrstuvwxyz \n.,");
  ModelConfig c;
  c.n_token = chars.vocab_size();
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 8;
  c.d_head = 4;
  c.d_inner = 16;
  c.mem_len = 8;
  Check(WriteInitialCheckpoint(path, c, chars, 1, 0.1).ok(), "writing the model");
  LanguageModelOptions options;
  options.path = path;
  auto model = LanguageModel::Create(options);
  Check(model.ok(), "loading the model");
  g_model = *std::move(model);
  auto session = g_model->NewSession(8);
  Check(session.ok(), "a session");
  StepInput input;
  input.session = session->get();
  input.tokens = {3, 1, 4, 1, 5};
  std::vector<StepInput> inputs = {input};
  Check(g_model->Step(absl::MakeSpan(inputs)).ok(), "feeding the session");
  Check((*session)->AppendTo(&g_image).ok(), "the session's image");
  return 0;
}

namespace {

void JournalDecoders(const std::string& bytes) {
  absl::StatusOr<SessionMeta> meta = DecodeSessionMeta(bytes);
  if (meta.ok()) {
    Check(EncodeSessionMeta(*meta) == bytes, "a meta that decodes encodes back to the same bytes");
  } else {
    Check(meta.status().code() == absl::StatusCode::kDataLoss, "DecodeSessionMeta refuses with DATA_LOSS");
  }
  // A replay sets the record's history around its snapshot (position 3)
  // from the log alone: whatever the record held before is replaced.
  JournalRecord record;
  record.image.position = 3;
  record.tail = {1};
  record.earlier = {2};
  size_t valid = 0;
  absl::Status s = ReplayJournalLog(bytes, &record, &valid);
  Check(s.ok() || s.code() == absl::StatusCode::kDataLoss, "ReplayJournalLog refuses with DATA_LOSS");
  if (!s.ok()) return;
  Check(record.image.position == 3, "a replay leaves the snapshot alone");
  Check(valid <= bytes.size(), "the valid prefix lies within the log");
  Check(record.history_start() >= 0 && record.history_start() <= 3, "the history starts at or before the snapshot");

  // The torn tail is never acknowledged: the valid prefix replays the same.
  JournalRecord again;
  again.image.position = 3;
  Check(ReplayJournalLog(bytes.substr(0, valid), &again).ok(), "the valid prefix replays");
  Check(again.tail == record.tail && again.earlier == record.earlier, "the valid prefix replays to the same history");

  // A rewind's cut log holds the history up to the cut and nothing after.
  if (record.tail.empty()) return;
  const int64_t cut = record.position() - 1;
  absl::StatusOr<std::string> cut_log = TruncateJournalLog(bytes, cut);
  Check(cut_log.ok(), "a log that replays can be cut inside its history");
  JournalRecord rewound;
  rewound.image.position = 3;
  Check(ReplayJournalLog(*cut_log, &rewound).ok(), "a cut log replays");
  if (cut == 3) {
    Check(rewound.tail.empty(), "a log cut at the snapshot has nothing after it");
  } else {
    Check(rewound.earlier == record.earlier, "a cut keeps the history before the snapshot");
    Check(rewound.tail.size() + 1 == record.tail.size() &&
              std::equal(rewound.tail.begin(), rewound.tail.end(), record.tail.begin()),
          "a cut drops exactly the tokens after it");
  }
  Check(TruncateJournalLog(bytes, record.position() + 1).status().code() == absl::StatusCode::kOutOfRange,
        "a cut past the history's end is OUT_OF_RANGE");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int mode = data[0] % 3;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);

  std::string bytes;
  bool well_formed = false;  // an export DecodeSessionExport must accept
  if (mode == 0) {
    bytes = rest;
    JournalDecoders(rest);
  } else {
    std::string image;
    size_t at = 1;  // rest[0]: the pending-token count
    if (mode == 1) {
      image = rest.size() > 1 ? rest.substr(1) : "";
    } else {
      image = g_image;
      while (at + 3 <= rest.size()) {
        const size_t offset =
            (static_cast<unsigned char>(rest[at]) | static_cast<unsigned char>(rest[at + 1]) << 8) % image.size();
        const size_t n = static_cast<unsigned char>(rest[at + 2]);
        at += 3;
        for (size_t k = 0; k < n && at < rest.size() && offset + k < image.size(); ++k, ++at)
          image[offset + k] = rest[at];
      }
    }
    SessionExport e;
    e.fingerprint = g_model->fingerprint();
    e.pending.assign(rest.empty() ? 0 : static_cast<unsigned char>(rest[0]) % 3, 7);
    // Wraps (no UB) when a patched header's position is near the int64 limit.
    e.position =
        static_cast<int64_t>(static_cast<uint64_t>(image.size() >= 72 ? HeaderField(image, 4) : 0) + e.pending.size());
    e.state = image;
    bytes = EncodeSessionExport(e);
    well_formed = e.position >= 0 && e.pending.size() <= 1;  // a session holds at most one pending token
  }

  absl::StatusOr<SessionExport> e = DecodeSessionExport(bytes);
  if (!e.ok()) {
    Check(e.status().code() == absl::StatusCode::kInvalidArgument, "DecodeSessionExport refuses with INVALID_ARGUMENT");
    Check(!well_formed, "a well-formed export decodes");
    return 0;
  }
  // Format version 1 (no model field) still decodes, and encodes back as the current version.
  uint32_t version = 0;
  std::memcpy(&version, bytes.data() + 8, sizeof(version));  // after the 8-byte magic (decoded: it is there)
  if (version == SessionExport::kVersion) {
    Check(EncodeSessionExport(*e) == bytes, "an export that decodes encodes back to the same bytes");
  } else {
    Check(version == 1 && DecodeSessionExport(EncodeSessionExport(*e)).ok(), "a version 1 export re-encodes");
  }
  if (e->fingerprint != g_model->fingerprint()) return 0;  // ImportSession refuses it (FAILED_PRECONDITION)
  Restore(e->state);
  return 0;
}
