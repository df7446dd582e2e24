"""What an auditor runs on a copied log directory, with public keys only.

`reader.LogDirectory` reads checkpoints and entries, `verify.verify_log` checks the whole
log (with `cosigned` for the witnesses' cosignatures), and `summary` folds the records into
what `owngate audit show` prints.

Imports `formats` only: an auditor needs neither the writer nor the witness.
"""

__all__: list[str] = []
