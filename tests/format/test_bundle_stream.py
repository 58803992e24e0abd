"""BundleFile: a bundle read once, in bounded chunks, each sink given exactly the bytes of its range, the content hash checked at the end."""
import hashlib
import os
import shutil

import pytest

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.format import bundle
from sunnypilot.modeld_v2.format.bundle import PREAMBLE, BundleFile, content_digest, read_bundle
from sunnypilot.modeld_v2.format.part_builder import KeptBlob

@pytest.fixture
def model(native_artifacts, tmp_path) -> str:
  path = str(tmp_path / "model.bin")
  shutil.copy(os.path.join(native_artifacts, "model.bin"), path)
  return path

def test_sinks_get_their_ranges_across_chunks(model, monkeypatch):
  monkeypatch.setattr(bundle, "CHUNK_BYTES", 1000)
  data = open(model, "rb").read()
  with BundleFile(model) as f:
    blob = data[len(data) - f.blob_len:]
    ranges = [(0, 1), (999, 1001), (5, 5), (1234, 9876), (f.blob_len - 3, f.blob_len), (1500, 2500)]  # straddling, empty, overlapping, last
    got = {r: bytearray(r[1] - r[0]) for r in ranges}
    def sink(r):
      def write(offset, piece): got[r][offset:offset + len(piece)] = piece
      return write
    f.stream([(a, b, sink((a, b))) for a, b in ranges])
  assert all(bytes(got[(a, b)]) == blob[a:b] for a, b in ranges)
  kept = KeptBlob(len(blob))
  with BundleFile(model) as f: f.stream([(10, 20, kept.keep(10, 20))])
  assert bytes(kept[12:15]) == blob[12:15] and bytes(kept[10:20]) == blob[10:20]
  with pytest.raises(ArtifactError, match="not kept"): kept[5:15]

def test_the_declared_hash_is_known_before_the_blob_and_checked_after(model):
  data = open(model, "rb").read()
  assert content_digest(model) == hashlib.sha256(data[PREAMBLE.size:]).hexdigest()
  edited = bytearray(data)
  edited[-1] ^= 1
  open(model, "wb").write(edited)
  assert content_digest(model) == hashlib.sha256(data[PREAMBLE.size:]).hexdigest()  # the preamble still declares the old content
  with pytest.raises(ArtifactError, match="content hash mismatch"): read_bundle(model)

def test_a_file_that_grows_or_shrinks_while_read_is_refused(model):
  data = open(model, "rb").read()
  with BundleFile(model) as f:
    open(model, "ab").write(b"x")
    with pytest.raises(ArtifactError, match="grew while it was read"): f.stream()
  open(model, "wb").write(data)
  with BundleFile(model) as f:
    os.truncate(model, len(data) - 10)
    with pytest.raises(ArtifactError, match="shrank while it was read"): f.stream()
