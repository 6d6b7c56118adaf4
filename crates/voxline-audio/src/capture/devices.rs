//! Input devices: listing them with their configurations, finding one by id
//! or name, and checking it before a capture starts.

use cpal::traits::{DeviceTrait, HostTrait};

#[cfg(doc)]
use super::Capture;
use super::CaptureError;
use crate::AudioError;

/// One range of configurations an input device supports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputConfigRange {
    /// Interleaved channels.
    pub channels: u16,
    /// Lowest sample rate in Hz.
    pub min_sample_rate: u32,
    /// Highest sample rate in Hz.
    pub max_sample_rate: u32,
    /// Sample format as cpal names it (`i16`, `f32`, …).
    pub sample_format: String,
}

/// An input device as [`list_input_devices`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputDeviceInfo {
    /// The host's identifier (an ALSA PCM name such as `default` or
    /// `hw:CARD=0,DEV=0`); [`Capture::start`] accepts it.
    pub id: String,
    /// The human-readable name (the first line of the host's description;
    /// the id where there is none); [`Capture::start`] accepts it too.
    pub name: String,
    /// Whether this is the host's default input device.
    pub is_default: bool,
    /// The device's default input configuration, when it could be read.
    pub default_config: Option<InputConfigRange>,
    /// The supported input configurations (empty when they could not be read).
    pub configs: Vec<InputConfigRange>,
    /// Why the configurations could not be read (device busy, cannot be
    /// opened…), if they could not.
    pub config_error: Option<String>,
}

impl InputDeviceInfo {
    /// Whether it can be captured from here: its input configurations could
    /// be read and there is at least one.
    #[must_use]
    pub fn is_usable(&self) -> bool {
        self.config_error.is_none() && !self.configs.is_empty()
    }
}

/// Lists the host's input devices with their supported configurations.
///
/// A device whose configurations cannot be read (busy, no permission) is
/// still listed, with [`InputDeviceInfo::config_error`] saying why.
///
/// # Errors
///
/// [`CaptureError::Enumerate`] (inside [`AudioError::Capture`]) when the audio
/// host cannot list its devices.
pub fn list_input_devices() -> Result<Vec<InputDeviceInfo>, AudioError> {
    list_devices(false)
}

/// Lists the host's output devices (where the voice can play) with their
/// supported output configurations, as [`list_input_devices`] does inputs.
///
/// # Errors
/// As [`list_input_devices`].
pub fn list_output_devices() -> Result<Vec<InputDeviceInfo>, AudioError> {
    list_devices(true)
}

fn list_devices(output: bool) -> Result<Vec<InputDeviceInfo>, AudioError> {
    crate::quiet::silence_audio_libraries();
    let host = cpal::default_host();
    let default = if output {
        host.default_output_device()
    } else {
        host.default_input_device()
    };
    let default_id = default
        .and_then(|d| d.id().ok())
        .map(|id| id.id().to_owned());
    let devices: Vec<cpal::Device> = if output {
        host.output_devices().map(Iterator::collect)
    } else {
        host.input_devices().map(Iterator::collect)
    }
    .map_err(|e| CaptureError::Enumerate {
        reason: e.to_string(),
    })?;
    let mut list = Vec::new();
    for device in devices {
        let (id, name) = device_names(&device);
        let supported = if output {
            device
                .supported_output_configs()
                .map(|r| r.map(|r| config_range(&r)).collect())
        } else {
            device
                .supported_input_configs()
                .map(|r| r.map(|r| config_range(&r)).collect())
        };
        let (configs, config_error) = match supported {
            Ok(ranges) => (ranges, None),
            Err(e) => (Vec::new(), Some(e.to_string())),
        };
        let default_config = if output {
            device.default_output_config()
        } else {
            device.default_input_config()
        }
        .ok()
        .map(|c| InputConfigRange {
            channels: c.channels(),
            min_sample_rate: c.sample_rate(),
            max_sample_rate: c.sample_rate(),
            sample_format: c.sample_format().to_string(),
        });
        list.push(InputDeviceInfo {
            is_default: default_id.as_deref() == Some(id.as_str()),
            id,
            name,
            default_config,
            configs,
            config_error,
        });
    }
    Ok(list)
}

fn config_range(r: &cpal::SupportedStreamConfigRange) -> InputConfigRange {
    InputConfigRange {
        channels: r.channels(),
        min_sample_rate: r.min_sample_rate(),
        max_sample_rate: r.max_sample_rate(),
        sample_format: r.sample_format().to_string(),
    }
}

/// The device's `(id, human-readable name)`; either falls back to the other.
pub(crate) fn device_names(device: &cpal::Device) -> (String, String) {
    let id = device.id().ok().map(|id| id.id().to_owned());
    let name = device.description().ok().map(|d| d.name().to_owned());
    match (id, name) {
        (Some(id), Some(name)) => (id, name),
        (Some(id), None) => (id.clone(), id),
        (None, Some(name)) => (name.clone(), name),
        (None, None) => ("(unnamed)".to_owned(), "(unnamed)".to_owned()),
    }
}

/// Finds the input device `wanted` (by id first, then by name) or the default.
pub(super) fn find_device(
    host: &cpal::Host,
    wanted: Option<&str>,
) -> Result<cpal::Device, CaptureError> {
    let Some(wanted) = wanted else {
        return host
            .default_input_device()
            .ok_or(CaptureError::NoInputDevice);
    };
    let mut devices: Vec<cpal::Device> = host
        .input_devices()
        .map_err(|e| CaptureError::Enumerate {
            reason: e.to_string(),
        })?
        .collect();
    let names: Vec<(String, String)> = devices.iter().map(device_names).collect();
    let by_id = names.iter().position(|(id, _)| id == wanted);
    let by_name = || names.iter().position(|(_, name)| name == wanted);
    match by_id.or_else(by_name) {
        Some(i) => Ok(devices.swap_remove(i)),
        None => Err(CaptureError::DeviceNotFound {
            name: wanted.to_owned(),
            available: names
                .into_iter()
                .map(|(id, name)| {
                    if id == name {
                        id
                    } else {
                        format!("{id} ({name})")
                    }
                })
                .collect(),
        }),
    }
}

/// Maps a cpal error met while opening `device` to a [`CaptureError`].
pub(super) fn open_error(device: &str, e: &cpal::Error) -> CaptureError {
    use cpal::ErrorKind as K;
    let device = device.to_owned();
    // cpal's sentences end with a full stop; ours goes on after a semicolon
    let reason = e.to_string().trim_end().trim_end_matches('.').to_owned();
    match e.kind() {
        K::DeviceBusy => CaptureError::DeviceBusy { device, reason },
        K::UnsupportedConfig | K::UnsupportedOperation | K::InvalidInput => {
            CaptureError::UnsupportedConfig { device, reason }
        }
        _ => CaptureError::CannotOpen { device, reason },
    }
}

/// Checks that `device` (as [`Capture::start`] takes it) exists and reports
/// a default input configuration, without starting a stream: lets a caller
/// refuse a missing device before any expensive set-up (loading models).
///
/// # Errors
/// As [`Capture::start`]: [`CaptureError::NoInputDevice`],
/// [`CaptureError::DeviceNotFound`], [`CaptureError::DeviceBusy`],
/// [`CaptureError::CannotOpen`], [`CaptureError::UnsupportedConfig`].
pub fn check_input_device(device: Option<&str>) -> Result<(), AudioError> {
    crate::quiet::silence_audio_libraries();
    let host = cpal::default_host();
    let device = find_device(&host, device)?;
    let (device_id, _) = device_names(&device);
    device
        .default_input_config()
        .map_err(|e| open_error(&device_id, &e))?;
    Ok(())
}
