"""C2PA manifests (the optional `c2pa-python` bindings): signed, embedded provenance saying an output was
made by AI (`c2pa.created` with digitalSourceType trainedAlgorithmicMedia), by which model and voice id.

c2pa-python 0.38 embeds manifests in WAV (a `C2PA` RIFF chunk), MP3 (an ID3 GEOB frame) and FLAC (an ID3
tag in front); Ogg Opus is not supported, so opus outputs carry the implicit label only. The manifest is
added after the implicit label, so its hard binding covers the label too.

Signing credentials: `c2pa_cert_file` + `c2pa_key_file` (a PEM chain and key, ES256/ES384/PS256…), else a
private CA and an ES256 signing certificate made once in `<data_dir>/c2pa/` whose names say
"self-signed, private deployment": validators show it as untrusted, which is what it is.
"""

from __future__ import annotations

import datetime
import io
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosyserve import __version__
from cosyserve.errors import SettingsError

log = logging.getLogger(__name__)

# FLAC is left out: c2pa writes its manifest in an ID3 tag before `fLaC`, which FLAC readers need not accept
MIME_TYPES = {"wav": "audio/wav", "mp3": "audio/mpeg"}
DIGITAL_SOURCE_TYPE = "http://cv.iptc.org/newscodes/digitalsourcetype/trainedAlgorithmicMedia"
GENERATION_ASSERTION = "org.cosyserve.generation"
PRIVATE_ORGANIZATION = "cosyserve private deployment (self-signed, not publicly trusted)"
CERT_FILE, KEY_FILE = "cert.pem", "key.pem"
UNTRUSTED = "signingCredential.untrusted"  # the signer's chain is not on the validator's trust list


def available() -> bool:
    """Whether c2pa-python can be imported (`pip install 'cosyserve[labels]'`)."""
    try:
        import c2pa  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class Credentials:
    chain_pem: bytes
    key_pem: bytes
    self_signed: bool  # made by this server for a private deployment
    alg: str = "es256"


def load_credentials(cert_file: Path | None, key_file: Path | None, data_dir: Path) -> Credentials:
    """The configured certificate and key, else the private ones in `<data_dir>/c2pa` (made once)."""
    if (cert_file is None) != (key_file is None):
        raise SettingsError("c2pa_cert_file and c2pa_key_file must be set together (or neither)")
    if cert_file is not None and key_file is not None:
        try:
            return Credentials(
                cert_file.read_bytes(), key_file.read_bytes(), self_signed=False, alg=_alg(key_file)
            )
        except OSError as exc:
            raise SettingsError(f"cannot read the C2PA certificate or key: {exc}") from exc
    folder = data_dir / "c2pa"
    cert_path, key_path = folder / CERT_FILE, folder / KEY_FILE
    if not (cert_path.is_file() and key_path.is_file()):
        chain, key = _make_private_credentials()
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(key)
        cert_path.write_bytes(chain)
        log.info("made a self-signed C2PA signing certificate for this private deployment in %s", folder)
    return Credentials(cert_path.read_bytes(), key_path.read_bytes(), self_signed=True)


def _alg(key_file: Path) -> str:
    """The signing algorithm for a PEM key: ES256/384/512 by curve, PS256 for RSA, Ed25519."""
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    key = load_pem_private_key(key_file.read_bytes(), password=None)
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return {256: "es256", 384: "es384", 521: "es512"}.get(key.curve.key_size, "es256")
    if isinstance(key, rsa.RSAPrivateKey):
        return "ps256"
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return "ed25519"
    raise SettingsError(f"{key_file}: use an EC, RSA or Ed25519 private key for C2PA signing")


def _make_private_credentials() -> tuple[bytes, bytes]:
    """A private CA and a signing certificate it issued (C2PA validators refuse a self-signed leaf)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def name(common: str) -> x509.Name:
        return x509.Name(
            [
                x509.NameAttribute(NameOID.COMMON_NAME, common),
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, PRIVATE_ORGANIZATION),
            ]
        )

    def usage(sign: bool) -> x509.KeyUsage:
        return x509.KeyUsage(sign, False, False, False, False, not sign, not sign, False, False)

    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(days=1), now + datetime.timedelta(days=3650)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = name("cosyserve private CA")
    ca = (
        x509.CertificateBuilder(
            ca_name, ca_name, ca_key.public_key(), x509.random_serial_number(), start, end
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage(False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder(
            name("cosyserve signer"), ca_name, key.public_key(), x509.random_serial_number(), start, end
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage(True), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.EMAIL_PROTECTION]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    chain = leaf.public_bytes(pem) + ca.public_bytes(pem)
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return chain, key_pem


class C2paSigner:
    """Signs outputs with one set of credentials (thread-safe: a Builder per file)."""

    def __init__(self, credentials: Credentials) -> None:
        import c2pa

        self._c2pa = c2pa
        self.credentials = credentials
        info = c2pa.C2paSignerInfo(credentials.alg.encode(), credentials.chain_pem, credentials.key_pem, None)
        self._signer = c2pa.Signer.from_info(info)

    def sign(self, data: bytes, fmt: str, *, content_id: str, model: str | None, voice: str | None) -> bytes:
        """`data` with an embedded manifest; formats outside MIME_TYPES come back unchanged."""
        mime = MIME_TYPES.get(fmt)
        if mime is None:
            return data
        builder = self._c2pa.Builder(self._manifest(content_id, model, voice))
        out = io.BytesIO()
        try:
            builder.sign(self._signer, mime, io.BytesIO(data), out)
        finally:
            builder.close()
        return out.getvalue()

    def _manifest(self, content_id: str, model: str | None, voice: str | None) -> dict[str, Any]:
        generation = {
            "content_id": content_id,
            "model": model,
            "voice_id": voice,  # the voice's id only: never the enrolled recording
            "ai_generated": True,
            "signer": "self-signed, private deployment" if self.credentials.self_signed else "configured",
        }
        return {
            "claim_generator_info": [{"name": "cosyserve", "version": __version__}],
            "title": content_id,
            "assertions": [
                {
                    "label": "c2pa.actions",
                    "data": {
                        "actions": [
                            {
                                "action": "c2pa.created",
                                "digitalSourceType": DIGITAL_SOURCE_TYPE,
                                "softwareAgent": {"name": "cosyserve", "version": __version__},
                            }
                        ]
                    },
                },
                {"label": GENERATION_ASSERTION, "data": generation},
            ],
        }


def read_manifest(data: bytes, fmt: str) -> dict[str, Any]:
    """What a file's C2PA manifest says: {"status": "absent" | "valid" | "invalid" | "unsupported" |
    "unavailable", …} with the validation state, whether the signer is trusted, the AI-generation flag,
    generation details and the signer. An untrusted signer alone (a self-signed private deployment)
    leaves the manifest valid: its signature and hashes still check."""
    if fmt not in MIME_TYPES:
        return {"status": "unsupported", "detail": f"C2PA manifests are not embedded in {fmt} files"}
    if not available():
        return {
            "status": "unavailable",
            "detail": "c2pa-python is not installed (pip install 'cosyserve[labels]')",
        }
    import c2pa

    try:
        reader = c2pa.Reader(MIME_TYPES[fmt], io.BytesIO(data))
    except c2pa.C2paError as exc:
        if "ManifestNotFound" in type(exc).__name__ or "not found" in str(exc).lower():
            return {"status": "absent"}
        return {"status": "invalid", "detail": str(exc)}
    try:
        manifest = reader.get_active_manifest() or {}
        state = reader.get_validation_state()
        results = reader.get_validation_results() or {}
    finally:
        reader.close()
    failures = [f.get("code") for f in (results.get("activeManifest") or {}).get("failure", [])]
    trusted = UNTRUSTED not in failures  # a private deployment's own certificate: valid, not trusted
    failures = [code for code in failures if code != UNTRUSTED]
    assertions = {a.get("label"): a.get("data") for a in manifest.get("assertions", [])}
    actions = (assertions.get("c2pa.actions") or assertions.get("c2pa.actions.v2") or {}).get("actions", [])
    return {
        "status": "valid" if state in ("Valid", "Trusted") and not failures else "invalid",
        "validation_state": state,
        "trusted_signer": trusted,
        "failures": failures,
        "ai_generated": any(a.get("digitalSourceType") == DIGITAL_SOURCE_TYPE for a in actions),
        "generation": assertions.get(GENERATION_ASSERTION),
        "signer": manifest.get("signature_info"),
    }
