//! CRC-32C (Castagnoli), the checksum of file headers, log records and snapshot blocks.
//!
//! The `crc32c` crate computes it: with the CPU's CRC instruction when there is one (SSE4.2 on
//! x86-64, detected at run time) and with tables otherwise.

/// Continues a CRC-32C over `b` (start with `crc32c_update(0, ..)`; chaining is allowed).
pub fn crc32c_update(crc: u32, b: &[u8]) -> u32 {
    ::crc32c::crc32c_append(crc, b)
}

/// CRC-32C (Castagnoli) of `b`.
pub fn crc32c(b: &[u8]) -> u32 {
    ::crc32c::crc32c(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit-at-a-time CRC-32C (reflected polynomial 0x82F63B78, initial value and final XOR
    /// 0xFFFFFFFF): the definition, to check the fast implementation against.
    fn crc32c_bitwise(b: &[u8]) -> u32 {
        let mut c = !0u32;
        for &x in b {
            c ^= x as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 { (c >> 1) ^ 0x82F6_3B78 } else { c >> 1 };
            }
        }
        !c
    }

    #[test]
    fn crc32c_check_values() {
        // The standard "123456789" check value and RFC 3720 B.4.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
        let inc: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&inc), 0x46DD_794E);
        let dec: Vec<u8> = (0..32).rev().collect();
        assert_eq!(crc32c(&dec), 0x113F_DB5C);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn crc32c_matches_definition_and_chains() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        // Every length from 0 to 64 and a few longer ones, at every start offset mod 8.
        for start in 0..8 {
            for len in (0..=64).chain([255, 256, 257, 991]) {
                let b = &data[start..start + len];
                assert_eq!(crc32c(b), crc32c_bitwise(b), "start {start}, len {len}");
            }
        }
        for cut in [0, 1, 7, 8, 333, 999, 1000] {
            assert_eq!(crc32c_update(crc32c(&data[..cut]), &data[cut..]), crc32c(&data), "cut {cut}");
        }
        assert_eq!(crc32c_update(0, &data), crc32c(&data));
    }
}
