//! `--backing-timing` and the other timing flags: device-timing emulation (E1), parsed
//! here and applied by `dhrd_stack`, so that each command keeps a single serving path
//! whatever the backing is.

use dhrd_io::{DeviceProfile, DEVICE_PROFILE_SYNTAX};

/// The clap parser of `--backing-timing`: a bad value names the accepted syntax.
pub fn parse(s: &str) -> Result<DeviceProfile, String> {
    DeviceProfile::parse(s).ok_or_else(|| format!("expected {DEVICE_PROFILE_SYNTAX}"))
}
