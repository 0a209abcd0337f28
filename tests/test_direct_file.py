"""DirectFile: the bytes written in any pieces land in the file exactly (a last block that is not aligned
included), its digest is the store's file_digest of the file, with O_DIRECT and on a filesystem without it;
save_optimizer's files load back to the same state and report their digest."""

import errno
import os

import pytest
import torch

from coopflow.artifacts import direct
from coopflow.artifacts.direct import DirectFile
from coopflow.artifacts.store import file_digest


def _pieces(total: int, seed: int = 0) -> list[bytes]:
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (total,), dtype=torch.uint8, generator=g).numpy().tobytes()
    cuts = sorted(torch.randint(0, total, (7,), generator=g).tolist()) if total else []
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, total])]


@pytest.mark.parametrize("total", [0, 1, direct.ALIGN, 3 * direct.ALIGN + 17, 10 * direct.ALIGN - 1])
def test_bytes_and_digest_as_written(tmp_path, monkeypatch, total):
    monkeypatch.setattr(direct, "BLOCK", 3 * direct.ALIGN)  # several blocks from small data
    path = tmp_path / "f.bin"
    pieces = _pieces(total)
    with DirectFile(path) as f:
        for p in pieces:
            assert f.write(memoryview(p)) == len(p)
    assert path.read_bytes() == b"".join(pieces)
    assert f.digest == file_digest(path)


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT on this platform")
def test_a_filesystem_without_o_direct_gets_a_buffered_file(tmp_path, monkeypatch):
    real_open = os.open

    def no_direct(path, flags, *args):  # as tmpfs before Linux 6.6 and some network filesystems answer
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(direct.os, "open", no_direct)
    data = b"".join(_pieces(5 * direct.ALIGN + 3, seed=1))
    path = tmp_path / "h.bin"
    with DirectFile(path) as f:
        f.write(data)
    assert not f.direct
    assert path.read_bytes() == data and f.digest == file_digest(path)


def test_digest_before_close_is_refused(tmp_path):
    f = DirectFile(tmp_path / "g.bin")
    with pytest.raises(ValueError, match="not closed"):
        _ = f.digest
    f.close()


def test_save_optimizer_round_trip_and_digest(tmp_path):
    from coopflow.stages.agents.models import save_optimizer

    torch.manual_seed(0)
    model = torch.nn.Linear(37, 11)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(5, 37)).square().sum().backward()
    opt.step()
    path = tmp_path / "agent_0.pt"
    digest = save_optimizer(opt, path)
    assert digest == file_digest(path)
    loaded = torch.load(path, weights_only=True)
    want = opt.state_dict()
    assert loaded["param_groups"] == want["param_groups"]
    for k, st in want["state"].items():
        for name, v in st.items():
            assert torch.equal(loaded["state"][k][name], v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_checkpoint_weights_written_direct_are_transformers_bytes(tiny_model_dir, tmp_path, dtype):
    """save_pretrained inside `_weights_written_direct` writes the same files byte for byte as transformers' own
    writer and reports the weights file's digest; outside it (and on other threads) transformers writes as before."""
    import threading

    from transformers import AutoModelForCausalLM

    from coopflow.stages.agents import models as M

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=dtype)
    model.save_pretrained(tmp_path / "plain")
    hashed: dict = {}
    with M._weights_written_direct(hashed):
        other: dict = {}
        t = threading.Thread(target=lambda: other.setdefault("ok", model.save_pretrained(tmp_path / "thread")))
        t.start(), t.join()
        model.save_pretrained(tmp_path / "direct")
    weights = tmp_path / "direct" / "model.safetensors"
    assert hashed == {weights: file_digest(weights)}  # only this thread's save was routed
    for name in sorted(p.name for p in (tmp_path / "plain").iterdir()):
        assert (tmp_path / "direct" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes(), name
        assert (tmp_path / "thread" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes(), name
    model.save_pretrained(tmp_path / "after")
    assert hashed == {weights: file_digest(weights)}  # outside the block: nothing reported
