//! [`CaptureError`]: what can go wrong opening or running a live input stream.

/// What can go wrong opening or running a live input stream.
///
/// Every message says what was wrong and what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// The audio host reports no default input device at all.
    #[error(
        "no audio input device found; connect a microphone and check that the system sees it \
         (`arecord -l` on Linux), or replay a WAV file instead"
    )]
    NoInputDevice,

    /// No input device has the requested name.
    #[error(
        "no input device named `{name}`; available input devices: {}; pass one of these names \
         (or none for the default), see `voxline devices`",
        list_or_none(.available)
    )]
    DeviceNotFound {
        /// The name asked for.
        name: String,
        /// Names of the input devices that exist.
        available: Vec<String>,
    },

    /// The device is in use by another program.
    #[error("input device `{device}` is busy: {reason}; close the program using it or pick another device")]
    DeviceBusy {
        /// The device.
        device: String,
        /// The audio host's description.
        reason: String,
    },

    /// The device exists but could not be opened (gone, no permission, host down…).
    #[error(
        "cannot open input device `{device}`: {reason}; check that it is plugged in and that this user \
         may use it (on Linux: member of the `audio` group), or pick another device"
    )]
    CannotOpen {
        /// The device.
        device: String,
        /// The audio host's description.
        reason: String,
    },

    /// The device's configuration cannot be captured from.
    #[error(
        "input device `{device}` has no usable input configuration: {reason}; pick another device"
    )]
    UnsupportedConfig {
        /// The device.
        device: String,
        /// What is unsupported.
        reason: String,
    },

    /// The stream was opened but failed to start or run.
    #[error(
        "the input stream of `{device}` failed: {reason}; check the device and restart the capture"
    )]
    Stream {
        /// The device.
        device: String,
        /// The audio host's description.
        reason: String,
    },

    /// The audio host could not list its devices.
    #[error("cannot list audio input devices: {reason}; check the audio system (ALSA/PulseAudio) is working")]
    Enumerate {
        /// The audio host's description.
        reason: String,
    },

    /// The consumer thread could not be started.
    #[error("cannot start the capture thread: {0}; the system is out of threads or memory")]
    Spawn(#[source] std::io::Error),
}

fn list_or_none(names: &[String]) -> String {
    if names.is_empty() {
        "(none)".to_owned()
    } else {
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_lists_the_available_devices() {
        let e = CaptureError::DeviceNotFound {
            name: "usb mic".into(),
            available: vec!["default".into(), "hw:CARD=0,DEV=0 (HDA Intel)".into()],
        };
        let msg = e.to_string();
        assert!(msg.contains("`usb mic`"), "{msg}");
        assert!(
            msg.contains("default, hw:CARD=0,DEV=0 (HDA Intel)"),
            "{msg}"
        );
        let none = CaptureError::DeviceNotFound {
            name: "x".into(),
            available: vec![],
        };
        assert!(none.to_string().contains("(none)"));
    }
}
