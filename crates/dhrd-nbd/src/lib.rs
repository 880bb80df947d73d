//! NBD frontend: serves one hybrid object of the engine over the NBD protocol.
