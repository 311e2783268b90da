package config

import (
	"crypto/sha256"
	"encoding/hex"

	"iop/internal/protocol"
	iop "iop/proto/gen/iop"

	"google.golang.org/protobuf/proto"
)

// NodePayload builds the NodeConfigPayload a node receives at registration
// and on refresh (SPEC L3, N2, N5): its adapters with resolved profiles and
// the runtime settings. It carries no secret, store path or work directory.
// Revision is the hex SHA-256 of the payload's deterministic encoding.
// It returns nil for an unknown node id.
func (c *Config) NodePayload(nodeID string) *iop.NodeConfigPayload {
	n := c.NodeByID(nodeID)
	if n == nil {
		return nil
	}
	return c.nodePayload(n)
}

func (c *Config) nodePayload(n *Node) *iop.NodeConfigPayload {
	nodeID := n.ID
	p := &iop.NodeConfigPayload{
		Runtime: &iop.NodeRuntimeConfig{
			HeartbeatIntervalMs: c.Heartbeat.IntervalMs,
			HeartbeatTimeoutMs:  c.Heartbeat.NodeTimeoutMs,
			CredentialsEnabled:  c.Credentials.Enabled,
			CertificateRenewal:  n.Enrolled,
		},
	}
	c.addCredentials(p.Runtime, nodeID)
	for i := range n.Adapters {
		a := &n.Adapters[i]
		ac := &iop.AdapterConfig{
			Name:                  a.Name,
			Type:                  a.Type,
			Category:              a.Category,
			Capacity:              int32(a.Capacity),
			LongCapacity:          int32(*a.LongCapacity),
			BaseUrl:               a.BaseURL,
			ApiKeyEnv:             a.APIKeyEnv,
			UpstreamIdleTimeoutMs: EffectiveUpstreamIdleTimeoutMs(a),
			Managed:               a.Managed,
			KeepAlive:             a.KeepAlive,
		}
		if c.Discovers(nodeID, a.Name) {
			ac.DiscoveryIntervalMs = c.Discovery.PollIntervalMs
		}
		if a.Type == protocol.TypeOpenAICompat {
			ac.OpenaiCompat = &iop.OpenAICompatAdapterConfig{ProtocolProfile: ResolveProfile(a)}
		}
		p.Adapters = append(p.Adapters, ac)
		p.Runtime.Concurrency += int32(a.Capacity)
	}
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(p)
	sum := sha256.Sum256(b)
	p.Revision = hex.EncodeToString(sum[:])
	return p
}

// addCredentials puts node's part of the credential projection into the
// payload's runtime (SPEC C6): nothing while the plane is off.
func (c *Config) addCredentials(rt *iop.NodeRuntimeConfig, node string) {
	if !c.Credentials.Enabled {
		return
	}
	nc := c.CredentialProjection.Nodes[node]
	rt.CredentialProjectionGeneration = nc.Generation
	rt.CredentialRecipientKeyId, rt.CredentialIssuerKeyId = nc.RecipientKeyID, nc.IssuerKeyID
	if len(nc.SlotRevisions) > 0 {
		rt.CredentialSlotRevisions = make(map[string]uint64, len(nc.SlotRevisions))
		for k, v := range nc.SlotRevisions {
			rt.CredentialSlotRevisions[k] = v
		}
	}
}

// AdapterRevision names what adapter a is as a node runs it (SPEC N2): the
// hex SHA-256 of the AdapterConfig's deterministic encoding without the
// numbers it is tuned by — capacity and long_capacity (the Edge's pool
// takes them from the payload the node runs), upstream_idle_timeout_ms
// and discovery_interval_ms (no request's outcome depends on them). Two
// payloads that give an adapter the same revision send its requests to the
// same backend the same way (type, category, base_url, api_key_env,
// protocol profile); the Edge's pool serves a node's generation only the
// adapters whose revision in the payload that generation runs is the one
// in the current config (pool.NodeRuns).
func AdapterRevision(a *iop.AdapterConfig) string {
	c := proto.CloneOf(a)
	c.Capacity, c.LongCapacity, c.UpstreamIdleTimeoutMs, c.DiscoveryIntervalMs = 0, 0, 0, 0
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
