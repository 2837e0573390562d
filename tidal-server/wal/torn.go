package wal

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/bits"
)

// sectorSize is the unit in which a device persists a write: after a power
// loss each aligned 512-byte sector of an unfinished write holds either
// its new bytes or its old ones, never a mix. Devices with larger
// physical sectors (4 KiB) persist whole multiples of it, and a killed
// process leaves a prefix of its write ending at a page boundary, so 512
// is the finest grain at which a tear can show.
const sectorSize = 512

// notTorn judges the bytes at off in data (a segment's whole content),
// where no record decodes and the bytes up to the end of the file are not
// all zero. It returns "" if they can be the remains of a write that did
// not complete, and otherwise why they cannot: then bytes that were written
// whole are damaged.
//
// Every segment is preallocated with zeroes and a write only ever lands in
// that zeroed space (or extends the file), so the part of a write that did
// not reach the disk reads as zeroes, or is missing at the end of the
// file. A torn record therefore
//
//   - is cut short by the end of the file (its header, or the length it
//     claims, runs past it), or
//   - has a zeroed sector: one of the pieces its bytes fall into when split
//     at 512-byte aligned file offsets is all zero.
//
// A record that is complete and has no zeroed piece reached the disk
// whole, and its checksum mismatch is damage, such as a flipped bit.
//
// A zeroed piece alone does not prove a tear: small records hold zero
// bytes of their own (the high bytes of a HardState's integers), and when
// one straddles a sector boundary the piece past it can be all zero
// although the whole record was written. So before the zeroed-piece test,
// a record that one flipped bit would make valid — in its length field,
// in its stored checksum, or in the type and payload the checksum covers —
// is judged damaged, unless that bit lies in a zeroed piece: a lost sector
// whose only set bit was that one explains the record as well, and a
// power cut makes lost sectors far more often than a flip clears the one
// set bit of a piece. A torn record is otherwise judged damaged only by
// the chance of a CRC-32C collision among its 8·n+64 single-bit variants
// (about n/2^29 for n bytes), and then fails safe: Open refuses a log it
// could have opened, and `tidal-server wal repair` cuts it.
func notTorn(data []byte, off int) string {
	b := data[off:]
	if len(b) < recordHeaderSize {
		return "" // the file ends inside the record header
	}
	if isZero(b[:recordHeaderSize]) {
		// The header was never written: the write's first sector did not
		// reach the disk. (Later sectors that did are what the caller's
		// test for valid records after the damage looks at.)
		return ""
	}
	length := binary.LittleEndian.Uint32(b[0:4])
	stored := binary.LittleEndian.Uint32(b[4:8])
	for bit := range 32 {
		l := length ^ 1<<bit
		if l > maxRecordPayload || recordHeaderSize+int64(l) > int64(len(b)) {
			continue
		}
		if inZeroPiece(data, off, off+recordHeaderSize+int(l), off+bit/8) {
			continue
		}
		if crc32.Checksum(b[8:recordHeaderSize+int(l)], castagnoli) == stored {
			return fmt.Sprintf("the record is whole with bit %d of its length field flipped (it claims %d payload bytes, its checksum matches %d): a damaged length, not a torn write", bit, length, l)
		}
	}
	if recordHeaderSize+int64(length) > int64(len(b)) {
		return "" // the record runs past the end of the file
	}
	end := recordHeaderSize + int(length)
	computed := crc32.Checksum(b[8:end], castagnoli)
	if computed == stored {
		return "its checksum matches, so the record was written whole"
	}
	if d := computed ^ stored; bits.OnesCount32(d) == 1 && !inZeroPiece(data, off, off+end, off+4+bits.TrailingZeros32(d)/8) {
		return "its stored checksum differs from the computed one in exactly one bit: a damaged checksum, not a torn write"
	}
	if at := singleBitError(b[8:end], computed^stored); at >= 0 && !inZeroPiece(data, off, off+end, off+8+at/8) {
		return fmt.Sprintf("one flipped bit at file offset %d (bit %d) accounts for its checksum mismatch: damage to a record written whole, not a torn write",
			int64(off)+8+int64(at/8), at%8)
	}
	if hasZeroSector(data, off, off+end) {
		return ""
	}
	return fmt.Sprintf("the record is complete (%d bytes) and none of its %d-byte sectors is zeroed, so the write reached the disk whole and its bytes were damaged since: not a torn write",
		end, sectorSize)
}

// hasZeroSector reports whether data[start:end], split at multiples of
// sectorSize (offsets within data, which is a whole file), has a piece
// that is all zero.
func hasZeroSector(data []byte, start, end int) bool {
	for p := start; p < end; {
		q := min(end, (p/sectorSize+1)*sectorSize)
		if isZero(data[p:q]) {
			return true
		}
		p = q
	}
	return false
}

// inZeroPiece reports whether byte pos of data lies in an all-zero piece of
// data[start:end] split at multiples of sectorSize.
func inZeroPiece(data []byte, start, end, pos int) bool {
	lo := max(start, pos/sectorSize*sectorSize)
	hi := min(end, (pos/sectorSize+1)*sectorSize)
	return isZero(data[lo:hi])
}

// singleBitError returns the position (8·byte + bit, bit 0 the least
// significant) of the one bit of msg whose flip changes its CRC-32C by
// syndrome, or -1 if no single bit does. CRC is linear: flipping bit k of
// byte j changes the checksum by the table entry for that bit carried
// through the len(msg)-1-j bytes after it as zeroes, independent of the
// message, so one backward pass over the positions finds it in 8·n steps.
func singleBitError(msg []byte, syndrome uint32) int {
	tab := castagnoli
	var regs [8]uint32
	for k := range regs {
		regs[k] = tab[1<<k]
	}
	for j := len(msg) - 1; j >= 0; j-- {
		for k, r := range regs {
			if r == syndrome {
				return j*8 + k
			}
		}
		for k, r := range regs {
			regs[k] = tab[byte(r)] ^ r>>8
		}
	}
	return -1
}
