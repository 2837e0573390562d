//go:build !linux

package relay

// dialControl is the upstream dial's Control function (see dial_linux.go).
var dialControl = tuneSocket
