//! `--backing-timing`: device-timing emulation (E1) of the backing, shared by the commands
//! that open one, so that each keeps a single serving path whatever the backing is.

use dhrd_io::{DeviceProfile, Durable, Timed, DEVICE_PROFILE_SYNTAX};
use std::sync::Arc;

/// The clap parser of `--backing-timing`: a bad value names the accepted syntax.
pub fn parse(s: &str) -> Result<DeviceProfile, String> {
    DeviceProfile::parse(s).ok_or_else(|| format!("expected {DEVICE_PROFILE_SYNTAX}"))
}

/// The backing as the engine should see it: wrapped in `Timed` when a profile is given.
/// Both are `Arc<dyn Durable>`, so the engine object has one type either way.
pub fn wrap(backing: Arc<dyn Durable>, profile: Option<DeviceProfile>) -> Arc<dyn Durable> {
    match profile {
        Some(p) => Arc::new(Timed::new(backing, p)),
        None => backing,
    }
}
