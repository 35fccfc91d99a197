//! Test-only `libmusa.so.1`: the MUSA driver API subset used by the mtgdrcopy tools, with the
//! real names and C signatures, backed by the emulated provider's `/dev/mtgpu_emu`.
