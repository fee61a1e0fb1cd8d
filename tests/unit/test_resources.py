"""Names every room shares: byte units, the sha256 spelling, the shipped files."""

import hashlib

from kubeseer import digests, resources, units


def test_byte_units_are_binary():
    assert (units.KIB, units.MIB, units.GIB) == (1024, 1024**2, 1024**3)


def test_a_sha256_is_64_lower_case_hex_digits_exactly():
    digest = hashlib.sha256(b"model").hexdigest()
    assert digests.is_sha256(digest)
    assert not digests.is_sha256(digest.upper())
    assert not digests.is_sha256(digest[:-1])
    assert not digests.is_sha256(digest + "0")


def test_a_checkout_reads_its_own_deploy_examples_and_hack():
    assert resources.from_checkout()
    assert resources.root() == resources.CHECKOUT
    for name in resources.SHIPPED:
        assert resources.path(name).is_dir()
    assert resources.path("hack", "build-control-plane.sh").is_file()
