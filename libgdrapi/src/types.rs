//! The values the API passes around: pin flags, attributes, mapping types and requests, and
//! what a pin's info says. Plain data shared by the safe API, the C shim and both backends.

use mtgdrdrv::gdr_mr_type_t;

/// Flags of [`crate::Gdr::pin`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PinFlags(pub u32);

impl PinFlags {
    pub const DEFAULT: PinFlags = PinFlags(mtgdrdrv::GDRDRV_PIN_BUFFER_FLAG_DEFAULT);
    /// Not supported by mtgpu: pins with it fail with `EINVAL`.
    pub const FORCE_PCIE: PinFlags = PinFlags(mtgdrdrv::GDRDRV_PIN_BUFFER_FLAG_FORCE_PCIE);
}

/// Attributes of [`crate::Gdr::attribute`]; values are gdrapi.h's `gdr_attr_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attribute {
    UsePersistentMapping = 1,
    SupportPinFlagForcePcie = 2,
    UsingDmaBufMmap = 3,
}

impl Attribute {
    pub fn from_raw(value: i32) -> Option<Attribute> {
        match value {
            1 => Some(Attribute::UsePersistentMapping),
            2 => Some(Attribute::SupportPinFlagForcePcie),
            3 => Some(Attribute::UsingDmaBufMmap),
            _ => None,
        }
    }
}

/// How a buffer is mapped; values are gdrapi.h's `gdr_mapping_type_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MappingType {
    None = 0,
    WriteCombining = 1,
    Caching = 2,
    Device = 3,
}

impl MappingType {
    pub fn from_raw(value: u32) -> Option<MappingType> {
        Some(match gdr_mr_type_t::from_u32(value)? {
            gdr_mr_type_t::GDR_MR_NONE => MappingType::None,
            gdr_mr_type_t::GDR_MR_WC => MappingType::WriteCombining,
            gdr_mr_type_t::GDR_MR_CACHING => MappingType::Caching,
            gdr_mr_type_t::GDR_MR_DEVICE => MappingType::Device,
        })
    }

    /// The strings of `gdr_get_mapping_type_string`.
    pub fn description(self) -> &'static str {
        match self {
            MappingType::None => "None",
            MappingType::WriteCombining => "Write Combining",
            MappingType::Caching => "Caching",
            MappingType::Device => "Device",
        }
    }
}

/// What mapping to ask for; values are gdrapi.h's `gdr_map_flags_t`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MapRequest {
    /// The driver's choice: write-combining on mtgpu.
    #[default]
    Default = 0,
    WriteCombining = 1,
    /// Refused on mtgpu (BAR memory is not coherent): `EOPNOTSUPP`.
    Caching = 2,
    /// Uncached device memory.
    Device = 3,
}

impl MapRequest {
    pub fn from_raw(value: i32) -> Option<MapRequest> {
        match value {
            0 => Some(MapRequest::Default),
            1 => Some(MapRequest::WriteCombining),
            2 => Some(MapRequest::Caching),
            3 => Some(MapRequest::Device),
            _ => None,
        }
    }
}

/// What the driver reports about a pin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Info {
    /// Start of the pinned range: the pinned address rounded down to the pin granule.
    pub va: u64,
    /// Length of the pinned range, rounded up to the pin granule.
    pub mapped_size: u64,
    /// The pin granule: the host page, on both backends.
    pub page_size: u32,
    /// Deprecated (upstream): time get_pages took, in TSC cycles.
    pub tm_cycles: u64,
    /// Deprecated (upstream): TSC rate.
    pub cycles_per_ms: u32,
    pub mapping_type: MappingType,
}

impl Info {
    pub fn mapped(&self) -> bool {
        self.mapping_type != MappingType::None
    }
    pub fn wc_mapping(&self) -> bool {
        self.mapping_type == MappingType::WriteCombining
    }
}
