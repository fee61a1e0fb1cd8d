"""Model downloads: http(s) and s3:// under limits and an SSRF guard, into a digest cache.

One module per job: `policy` (the limits a fetch obeys), `guard` (which hosts and addresses a
URL may reach), `transfer` (one guarded GET streamed to disk), `s3` (request signing),
`cache` (verified models by sha256), `download` (retries and verification), `cancel`
(interrupting a fetch whose DLJob is gone) and `errors` (why a fetch failed).
"""

from kubeseer.operator.fetch import cache, cancel, download, errors, guard, policy, s3, transfer

__all__ = ["cache", "cancel", "download", "errors", "guard", "policy", "s3", "transfer"]
