"""hydra_ops.hashing: the one home of bytes, file and state-dict SHA-256."""

import hashlib

import pytest
import torch
from torch import nn

from hydra_ops import hashing
from hydra_ops.data import sha256_file as data_sha256
from hydra_ops.hydra.serialization import sha256_file as serialization_sha256
from hydra_ops.hydra.serialization import state_dict_hash
from hydra_ops.models.checkpoints import sha256_file as checkpoints_sha256


def test_sha256_file_matches_hashlib_across_chunks(tmp_path):
    path = tmp_path / "blob.bin"
    data = bytes(range(256)) * 5000  # > 1 MiB: several chunks
    path.write_bytes(data)
    expected = hashlib.sha256(data).hexdigest()
    assert hashing.sha256_file(path) == expected
    assert hashing.sha256_file(path, chunk_size=7) == expected
    assert serialization_sha256 is data_sha256 is checkpoints_sha256 is hashing.sha256_file
    path.write_bytes(b"")
    assert hashing.sha256_file(path) == hashlib.sha256(b"").hexdigest()


def test_sha256_bytes_hashes_the_concatenation_of_its_chunks():
    assert hashing.sha256_bytes(b"ab", b"", b"c") == hashlib.sha256(b"abc").hexdigest()
    assert hashing.sha256_bytes() == hashlib.sha256(b"").hexdigest()


def test_state_dict_sha256_covers_names_dtypes_and_0_dim_tensors():
    module = nn.Linear(3, 2)
    module.register_buffer("temperature", torch.ones(()))
    digest = hashing.state_dict_sha256(module)
    assert digest == hashing.state_dict_sha256(dict(reversed(module.state_dict().items())))
    assert state_dict_hash(module) == digest
    with torch.no_grad():
        module.temperature.fill_(2.0)
    assert hashing.state_dict_sha256(module) != digest
    assert hashing.state_dict_sha256(module.double()) != hashing.state_dict_sha256(module.float())


def test_library_versions_refuses_an_unknown_missing_mode():
    from hydra_ops.versions import library_versions

    with pytest.raises(ValueError, match=r"missing must be one of \['none', 'omit'\]"):
        library_versions(missing="skip")  # type: ignore[arg-type]
    versions = library_versions(optional=("no_such_module_xyz",))
    assert versions["no_such_module_xyz"] is None and versions["torch"] == torch.__version__
    assert "no_such_module_xyz" not in library_versions(
        optional=("no_such_module_xyz",), missing="omit"
    )
