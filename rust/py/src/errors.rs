//! Python exceptions live in `jitkey/errors.py` (documented and typed there); Rust imports them.

pyo3::import_exception!(jitkey.errors, UnsupportedKeyError);
pyo3::import_exception!(jitkey.errors, KeyDepthError);
pyo3::import_exception!(jitkey.errors, KeyLengthError);
pyo3::import_exception!(jitkey.errors, IndexClosedError);
pyo3::import_exception!(jitkey.errors, ValueTooLargeError);
pyo3::import_exception!(jitkey.errors, DiskIndexWarning);
pyo3::import_exception!(jitkey.errors, ArgumentError);
pyo3::import_exception!(jitkey.errors, SignatureError);
