//! Finding the output device the voice plays on.

use cpal::traits::{DeviceTrait, HostTrait};

use super::PlaybackError;
use crate::AudioError;

/// Finds output device `wanted` (by id, then by name) or the default.
pub(super) fn find_output(
    host: &cpal::Host,
    wanted: Option<&str>,
) -> Result<cpal::Device, PlaybackError> {
    let Some(wanted) = wanted else {
        return host
            .default_output_device()
            .ok_or(PlaybackError::NoOutputDevice);
    };
    let mut devices: Vec<cpal::Device> = host
        .output_devices()
        .map_err(|e| PlaybackError::Enumerate(e.to_string()))?
        .collect();
    let names: Vec<(String, String)> = devices.iter().map(crate::capture::device_names).collect();
    let by_id = names.iter().position(|(id, _)| id == wanted);
    match by_id.or_else(|| names.iter().position(|(_, n)| n == wanted)) {
        Some(i) => Ok(devices.swap_remove(i)),
        None => Err(PlaybackError::DeviceNotFound {
            name: wanted.to_owned(),
            available: names.into_iter().map(|(id, _)| id).collect(),
        }),
    }
}

/// Checks that output device `device` exists and has a default output
/// configuration, without playing: a missing device is refused before the
/// models load.
///
/// # Errors
/// As [`super::Speaker::open`].
pub fn check_output_device(device: Option<&str>) -> Result<(), AudioError> {
    crate::quiet::silence_audio_libraries();
    let host = cpal::default_host();
    let d = find_output(&host, device)?;
    let (id, _) = crate::capture::device_names(&d);
    d.default_output_config()
        .map_err(|e| PlaybackError::CannotOpen {
            device: id,
            reason: e.to_string(),
        })?;
    Ok(())
}
