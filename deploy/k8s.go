package deploy

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"path"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/server"
)

// PodIndexLabel is the label kubelet sets on every StatefulSet pod to its
// ordinal (Kubernetes 1.28+): the source of each member's id.
const PodIndexLabel = "apps.kubernetes.io/pod-index"

// kustomization is the subset of kustomize's Kustomization the manifests
// use; anything else is an unknown field.
type kustomization struct {
	APIVersion      string   `json:"apiVersion"`
	Kind            string   `json:"kind"`
	Resources       []string `json:"resources"`
	SecretGenerator []struct {
		Name  string   `json:"name"`
		Files []string `json:"files"`
	} `json:"secretGenerator"`
	GeneratorOptions struct {
		DisableNameSuffixHash bool `json:"disableNameSuffixHash"`
	} `json:"generatorOptions"`
}

// K8s is the decoded manifest set of a kustomization directory.
type K8s struct {
	StatefulSets []*appsv1.StatefulSet
	Services     []*corev1.Service
	PDBs         []*policyv1.PodDisruptionBudget
	ConfigMaps   []*corev1.ConfigMap
	// Secrets maps each generated Secret's name to its keys.
	Secrets map[string][]string
	// where maps each object to "file: Kind name" for messages.
	where map[any]string
}

func (k *K8s) at(obj any, field string) string { return k.where[obj] + ": " + field }

// LoadK8s decodes the kustomization in fsys (kustomization.yaml at its
// root) and every resource it lists, strictly. Every .yaml file beside
// it must be listed: a manifest that is not applied is not validated.
func LoadK8s(fsys fs.FS) (*K8s, error) {
	data, err := fs.ReadFile(fsys, "kustomization.yaml")
	if err != nil {
		return nil, err
	}
	var kz kustomization
	if err := strictDecode(data, &kz); err != nil {
		return nil, fmt.Errorf("kustomization.yaml: %w", err)
	}
	if kz.Kind != "Kustomization" || kz.APIVersion != "kustomize.config.k8s.io/v1beta1" {
		return nil, fmt.Errorf("kustomization.yaml: expected kind Kustomization of kustomize.config.k8s.io/v1beta1, found %s %s", kz.Kind, kz.APIVersion)
	}
	files, err := fs.Glob(fsys, "*.yaml")
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		if f != "kustomization.yaml" && !slices.Contains(kz.Resources, f) {
			return nil, fmt.Errorf("kustomization.yaml: resources: %s is not listed (it would not be applied)", f)
		}
	}
	k := &K8s{Secrets: map[string][]string{}, where: map[any]string{}}
	for _, sg := range kz.SecretGenerator {
		if !kz.GeneratorOptions.DisableNameSuffixHash {
			return nil, fmt.Errorf("kustomization.yaml: generatorOptions.disableNameSuffixHash: expected true (the StatefulSet names the Secret %q)", sg.Name)
		}
		for _, f := range sg.Files {
			key, _, ok := strings.Cut(f, "=")
			if !ok {
				key = path.Base(f)
			}
			k.Secrets[sg.Name] = append(k.Secrets[sg.Name], key)
		}
	}
	for _, f := range kz.Resources {
		data, err := fs.ReadFile(fsys, f)
		if err != nil {
			return nil, fmt.Errorf("kustomization.yaml: resources: %w", err)
		}
		for i, doc := range splitDocuments(data) {
			if err := k.decode(fmt.Sprintf("%s (document %d)", f, i+1), doc); err != nil {
				return nil, err
			}
		}
	}
	return k, nil
}

var docSeparator = regexp.MustCompile(`(?m)^---\s*$`)

func splitDocuments(data []byte) [][]byte {
	var out [][]byte
	for _, d := range docSeparator.Split(string(data), -1) {
		if strings.TrimSpace(stripComments(d)) != "" {
			out = append(out, []byte(d))
		}
	}
	return out
}

func stripComments(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// decode reads one document into its typed object, refusing unknown
// fields (sigs.k8s.io/yaml's strict mode names them).
func (k *K8s) decode(where string, doc []byte) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	var obj any
	var meta *metav1.ObjectMeta
	want := map[string]string{"StatefulSet": "apps/v1", "Service": "v1", "PodDisruptionBudget": "policy/v1", "ConfigMap": "v1"}[tm.Kind]
	if want == "" {
		return fmt.Errorf("%s: kind %q: expected StatefulSet, Service, PodDisruptionBudget or ConfigMap", where, tm.Kind)
	}
	if tm.APIVersion != want {
		return fmt.Errorf("%s: %s: apiVersion: expected %s, found %q", where, tm.Kind, want, tm.APIVersion)
	}
	switch tm.Kind {
	case "StatefulSet":
		o := &appsv1.StatefulSet{}
		obj, meta = o, &o.ObjectMeta
		k.StatefulSets = append(k.StatefulSets, o)
	case "Service":
		o := &corev1.Service{}
		obj, meta = o, &o.ObjectMeta
		k.Services = append(k.Services, o)
	case "PodDisruptionBudget":
		o := &policyv1.PodDisruptionBudget{}
		obj, meta = o, &o.ObjectMeta
		k.PDBs = append(k.PDBs, o)
	case "ConfigMap":
		o := &corev1.ConfigMap{}
		obj, meta = o, &o.ObjectMeta
		k.ConfigMaps = append(k.ConfigMaps, o)
	}
	if err := strictDecode(doc, obj); err != nil {
		return fmt.Errorf("%s: %s %s: %w", where, tm.Kind, meta.Name, err)
	}
	k.where[obj] = fmt.Sprintf("%s: %s %s", where, tm.Kind, meta.Name)
	return nil
}

// strictDecode decodes as the API server's strict field validation does:
// an unknown or duplicated field is an error naming its full path
// ("spec.template.spec.containers[0].imagePullPolicyy").
func strictDecode(doc []byte, obj any) error {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(js, obj)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// CheckK8s checks the set's invariants against srv.
func CheckK8s(k *K8s, srv Server) *Report {
	r := &Report{}
	if len(k.StatefulSets) != 1 {
		r.problem("k8s", "expected one StatefulSet, found %d", len(k.StatefulSets))
		return r
	}
	sts := k.StatefulSets[0]
	spec := &sts.Spec
	at := func(field string) string { return k.at(sts, field) }

	// Membership: an odd number of voters, ids from the ordinal.
	if spec.Replicas == nil {
		r.problem(at("spec.replicas"), "expected an explicit odd number of members, found none (Kubernetes would run 1)")
		return r
	}
	replicas := int(*spec.Replicas)
	if replicas < 1 || replicas%2 == 0 {
		r.problem(at("spec.replicas"), "expected an odd number of members (a quorum tolerates (n-1)/2 failures; an even n adds a member and no tolerance), found %d", replicas)
	}
	if spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		r.problem(at("spec.podManagementPolicy"), "expected Parallel: /readyz needs a leader, a leader needs a quorum, so ordered start-up never finishes; found %q", spec.PodManagementPolicy)
	}
	start := 0
	if spec.Ordinals != nil {
		start = int(spec.Ordinals.Start)
	}
	if start < 1 {
		r.problem(at("spec.ordinals.start"), "expected at least 1: the pod ordinal is the member id, and ids are > 0; found %d", start)
	}
	if spec.Selector == nil || !matches(spec.Selector.MatchLabels, spec.Template.Labels) {
		r.problem(at("spec.selector"), "expected it to select the template's labels %v", spec.Template.Labels)
	}
	if len(spec.Template.Spec.Containers) != 1 {
		r.problem(at("spec.template.spec.containers"), "expected one container, found %d", len(spec.Template.Spec.Containers))
		return r
	}
	c := &spec.Template.Spec.Containers[0]
	cat := func(field string) string { return at("spec.template.spec.containers[" + c.Name + "]." + field) }
	if repo, _, _ := strings.Cut(c.Image, ":"); path.Base(repo) != "tidal-server" {
		r.problem(cat("image"), "expected the tidal-server image (make images), found %q", c.Image)
	}
	if len(c.Command) > 0 {
		r.problem(cat("command"), "expected none: the image's entrypoint is tidal-server; found %q", c.Command)
	}
	flags := runFlags(r, cat("args"), c.Args)

	// The id: --id=$(VAR), VAR the pod index.
	idVar := ""
	if m := regexp.MustCompile(`^\$\(([A-Za-z_][A-Za-z0-9_]*)\)$`).FindStringSubmatch(flags["id"]); m != nil {
		idVar = m[1]
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if e, ok := env[idVar]; !ok || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil ||
		e.ValueFrom.FieldRef.FieldPath != "metadata.labels['"+PodIndexLabel+"']" {
		r.problem(cat("args --id"), "expected --id=$(VAR) with env VAR from fieldRef metadata.labels['%s'] (the ordinal is the member id), found --id=%q", PodIndexLabel, flags["id"])
		idVar = ""
	}

	// Every pod's arguments as kubelet expands them parse as the server's.
	ids := make([]uint64, 0, replicas)
	for i := 0; i < replicas; i++ {
		ids = append(ids, uint64(start+i))
	}
	for _, id := range ids {
		args, err := expand(c.Args, env, idVar, id)
		if err != nil {
			r.problem(cat("args"), "%v", err)
			break
		}
		checkRun(r, srv, fmt.Sprintf("%s (pod %s-%d)", cat("args"), sts.Name, id), cat("args"), args)
	}

	// Listeners and ports.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	clientPort := checkListen(r, cat("args --client-addr"), flags["client-addr"], ports, "client")
	peerPort := checkListen(r, cat("args --peer-addr"), flags["peer-addr"], ports, "peer")

	// The client address each member publishes (what `status` dials to
	// reach the leader): its stable name and the client port, never the
	// 0.0.0.0 it listens on.
	for _, id := range ids {
		args, err := expand(c.Args, env, idVar, id)
		if err != nil {
			break
		}
		adv, _ := flagValue(args, "advertise-client-addr")
		host, port, err := net.SplitHostPort(adv)
		want := fmt.Sprintf("%s-%d.%s", sts.Name, id, spec.ServiceName)
		if err != nil || (host != want && !strings.HasPrefix(host, want+".")) || port != strconv.Itoa(int(clientPort)) {
			r.problem(cat("args --advertise-client-addr"), "pod %s-%d: expected %s:%d (its stable name and the client port), found %q", sts.Name, id, want, clientPort, adv)
		}
	}

	// Peers: exactly the member ids, each at its pod's stable name.
	members, err := server.ParsePeers(flags["peers"])
	if err != nil {
		r.problem(cat("args --peers"), "%v", err)
	}
	var got []uint64
	for _, m := range members {
		got = append(got, m.ID)
		host, port, _ := net.SplitHostPort(m.PeerAddr)
		want := fmt.Sprintf("%s-%d.%s", sts.Name, m.ID, spec.ServiceName)
		if host != want && !strings.HasPrefix(host, want+".") {
			r.problem(cat("args --peers"), "member %d: expected pod %s-%d's stable name %s[.namespace...], found %q", m.ID, sts.Name, m.ID, want, host)
		}
		if port != strconv.Itoa(int(peerPort)) {
			r.problem(cat("args --peers"), "member %d: expected the peer port %d, found %q", m.ID, peerPort, port)
		}
	}
	sort.Slice(got, func(i, j int) bool { return got[i] < got[j] })
	if !slices.Equal(got, ids) {
		r.problem(cat("args --peers"), "expected members %v (ordinals %d..%d of %d replicas), found %v", ids, start, start+replicas-1, replicas, got)
	}

	// Probes: the routes exist; the port is the client port; HTTPS when
	// the client plane is TLS.
	scheme := corev1.URISchemeHTTP
	if _, tls := flags["certs-dir"]; tls {
		scheme = corev1.URISchemeHTTPS
	}
	checkProbe(r, cat("readinessProbe"), c.ReadinessProbe, "/readyz", ports, clientPort, scheme, srv)
	checkProbe(r, cat("livenessProbe"), c.LivenessProbe, "/healthz", ports, clientPort, scheme, srv)

	// Resources.
	for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[res]; !ok {
			r.problem(cat("resources.requests."+string(res)), "expected a request (the scheduler places members by it)")
		}
		if _, ok := c.Resources.Limits[res]; !ok {
			r.problem(cat("resources.limits."+string(res)), "expected a limit")
		}
	}

	// Volumes: data on a claim, the schema from a ConfigMap, the certs
	// from the Secret.
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	vols := map[string]corev1.Volume{}
	for _, v := range spec.Template.Spec.Volumes {
		vols[v.Name] = v
	}
	if m, ok := mounts[flags["data-dir"]]; !ok || !slices.ContainsFunc(spec.VolumeClaimTemplates, func(p corev1.PersistentVolumeClaim) bool { return p.Name == m.Name }) {
		r.problem(cat("volumeMounts"), "expected --data-dir %q mounted from a volumeClaimTemplate (the member's data must outlive the pod)", flags["data-dir"])
	}
	if sp, ok := flags["schema"]; ok {
		checkSchema(r, k, cat("args --schema"), sp, mounts, vols)
	}
	if dir, ok := flags["certs-dir"]; ok {
		checkCerts(r, k, cat("volumeMounts"), dir, idVar, ids, mounts, vols, &spec.Template.Spec, c, srv)
	}
	sc := spec.Template.Spec.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		r.problem(at("spec.template.spec.securityContext.runAsNonRoot"), "expected true (the image's user is uid 65532)")
	}

	// Services and the disruption budget.
	checkServices(r, k, sts, clientPort, peerPort)
	checkPDB(r, k, sts, replicas)
	return r
}

func matches(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// expand does what kubelet does to args: $(VAR) becomes the variable's
// value ($$ escapes). The id variable takes each pod's ordinal.
func expand(args []string, env map[string]corev1.EnvVar, idVar string, id uint64) ([]string, error) {
	ref := regexp.MustCompile(`\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	out := make([]string, len(args))
	for i, a := range args {
		var err error
		out[i] = ref.ReplaceAllStringFunc(a, func(m string) string {
			if m == "$$" {
				return "$"
			}
			name := m[2 : len(m)-1]
			if name == idVar {
				return strconv.FormatUint(id, 10)
			}
			if e, ok := env[name]; ok && e.ValueFrom == nil {
				return e.Value
			}
			err = fmt.Errorf("argument %q refers to $(%s), which no plain env var of the container defines (kubelet would pass it literally)", a, name)
			return m
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// checkListen checks a listen flag binds every interface of the pod on
// the container port named name, and returns the port.
func checkListen(r *Report, where, addr string, ports map[string]int32, name string) int32 {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		r.problem(where, "expected host:port, found %q", addr)
		return 0
	}
	if host != "0.0.0.0" && host != "" && host != "::" {
		r.problem(where, "expected to listen on every interface of the pod (0.0.0.0), found host %q: nothing outside the pod could reach it", host)
	}
	n, _ := strconv.Atoi(port)
	if p, ok := ports[name]; !ok || int(p) != n {
		r.problem(where, "expected containerPort %q to be %s, found %d (ports %v)", name, port, p, ports)
	}
	return int32(n)
}

func checkProbe(r *Report, where string, p *corev1.Probe, path string, ports map[string]int32, clientPort int32, scheme corev1.URIScheme, srv Server) {
	if p == nil || p.HTTPGet == nil {
		r.problem(where, "expected an httpGet probe of %s", path)
		return
	}
	g := p.HTTPGet
	if g.Path != path {
		r.problem(where+".httpGet.path", "expected %s, found %q", path, g.Path)
	}
	if err := srv.ServesGET(g.Path); err != nil {
		r.problem(where+".httpGet.path", "%v", err)
	}
	port := g.Port.IntVal
	if g.Port.Type == intstr.String {
		port = ports[g.Port.StrVal]
	}
	if port != clientPort {
		r.problem(where+".httpGet.port", "expected the client port %d, found %s (= %d)", clientPort, g.Port.String(), port)
	}
	if s := g.Scheme; s != scheme && !(s == "" && scheme == corev1.URISchemeHTTP) {
		r.problem(where+".httpGet.scheme", "expected %s (the client plane is %s), found %q", scheme, map[corev1.URIScheme]string{corev1.URISchemeHTTP: "plain HTTP without --certs-dir", corev1.URISchemeHTTPS: "TLS with --certs-dir"}[scheme], s)
	}
}

func checkSchema(r *Report, k *K8s, where, file string, mounts map[string]corev1.VolumeMount, vols map[string]corev1.Volume) {
	m, ok := mounts[path.Dir(file)]
	v := vols[m.Name]
	if !ok || v.ConfigMap == nil {
		r.problem(where, "expected %s's directory mounted from a ConfigMap volume", file)
		return
	}
	i := slices.IndexFunc(k.ConfigMaps, func(c *corev1.ConfigMap) bool { return c.Name == v.ConfigMap.Name })
	if i < 0 {
		r.problem(where, "ConfigMap %q: not among the manifests", v.ConfigMap.Name)
		return
	}
	data, ok := k.ConfigMaps[i].Data[path.Base(file)]
	if !ok {
		r.problem(k.at(k.ConfigMaps[i], "data"), "expected the key %s (--schema=%s)", path.Base(file), file)
		return
	}
	if _, err := ledger.ParseSchema([]byte(data)); err != nil {
		r.problem(k.at(k.ConfigMaps[i], "data."+path.Base(file)), "the server refuses the schema: %v", err)
	}
}

// checkCerts checks each member gets its own ca.crt, node.crt and
// node.key at --certs-dir from the Secret, read-only, written 0400, and
// that the server's user can read its key as kubelet writes it.
func checkCerts(r *Report, k *K8s, where, dir, idVar string, ids []uint64, mounts map[string]corev1.VolumeMount, vols map[string]corev1.Volume, pod *corev1.PodSpec, c *corev1.Container, srv Server) {
	m, ok := mounts[dir]
	v := vols[m.Name]
	if !ok || v.Secret == nil {
		r.problem(where, "expected --certs-dir %q mounted from a Secret volume", dir)
		return
	}
	if !m.ReadOnly {
		r.problem(where+"["+m.Name+"].readOnly", "expected true")
	}
	if m.SubPathExpr != "$("+idVar+")" || idVar == "" {
		r.problem(where+"["+m.Name+"].subPathExpr", "expected $(%s): each member mounts only its own directory of the Secret, found %q", idVar, m.SubPathExpr)
	}
	sv := v.Secret
	vwhere := fmt.Sprintf("%s: spec.template.spec.volumes[%s].secret", strings.SplitN(where, ": spec", 2)[0], v.Name)
	if sv.DefaultMode == nil || *sv.DefaultMode != 0o400 {
		r.problem(vwhere+".defaultMode", "expected 0400 (a node key is readable by its owner only)")
	}
	keys, ok := k.Secrets[sv.SecretName]
	if !ok {
		r.problem(vwhere+".secretName", "expected a Secret the kustomization generates, found %q (generated: %v)", sv.SecretName, k.Secrets)
	}
	items := map[string]string{}
	for _, it := range sv.Items {
		items[it.Path] = it.Key
		if ok && !slices.Contains(keys, it.Key) {
			r.problem(vwhere+".items", "key %q: not in Secret %s (keys %v)", it.Key, sv.SecretName, keys)
		}
		if it.Mode != nil {
			r.problem(vwhere+".items["+it.Path+"].mode", "expected none (defaultMode 0400 applies)")
		}
	}
	for _, id := range ids {
		for _, f := range []string{"ca.crt", "node.crt", "node.key"} {
			if _, ok := items[fmt.Sprintf("%d/%s", id, f)]; !ok {
				r.problem(vwhere+".items", "expected path %d/%s: member %d needs its own %s", id, f, id, f)
			}
		}
	}
	// How kubelet writes the files: owner root, mode defaultMode, and
	// with an fsGroup, group fsGroup and group read added.
	mode := fs.FileMode(0o644)
	if sv.DefaultMode != nil {
		mode = fs.FileMode(*sv.DefaultMode)
	}
	var uid, gid *int64
	if pod.SecurityContext != nil {
		uid, gid = pod.SecurityContext.RunAsUser, pod.SecurityContext.FSGroup
	}
	if c.SecurityContext != nil && c.SecurityContext.RunAsUser != nil {
		uid = c.SecurityContext.RunAsUser
	}
	if gid != nil {
		mode |= 0o440
	}
	readable := uid != nil && *uid == 0 || gid != nil && mode&0o040 != 0 || mode&0o004 != 0
	if uid == nil {
		r.problem(vwhere, "expected runAsUser set: who reads node.key is otherwise the image's business")
	} else if !readable {
		r.problem(vwhere, "node.key would be mode %#o, owner root%s: uid %d cannot read it (set the pod's fsGroup to the server's group)", mode, map[bool]string{true: fmt.Sprintf(", group %d", deref(gid)), false: ""}[gid != nil], *uid)
	}
	// The server's process: its group is runAsGroup, and kubelet adds the
	// fsGroup to its supplementary groups.
	var groups []int
	owner := 0
	if pod.SecurityContext != nil && pod.SecurityContext.RunAsGroup != nil {
		groups = append(groups, int(*pod.SecurityContext.RunAsGroup))
	}
	if gid != nil {
		groups, owner = append(groups, int(*gid)), int(*gid)
	}
	if err := srv.KeyAccepted(mode, 0, owner, groups); err != nil {
		r.problem(vwhere, "node.key as kubelet writes it (mode %#o, owner root, group %d): %v", mode, owner, err)
	}
}

func deref(p *int64) int64 {
	if p == nil {
		return -1
	}
	return *p
}

func checkServices(r *Report, k *K8s, sts *appsv1.StatefulSet, clientPort, peerPort int32) {
	labels := sts.Spec.Template.Labels
	targets := func(svc *corev1.Service, name string, port int32) bool {
		return slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool {
			return p.TargetPort.StrVal == name || (p.TargetPort.Type == intstr.Int && p.TargetPort.IntVal == port) ||
				(p.TargetPort.IntVal == 0 && p.TargetPort.StrVal == "" && p.Port == port)
		})
	}
	var headless, client bool
	for _, svc := range k.Services {
		if svc.Name == sts.Spec.ServiceName {
			headless = true
			if svc.Spec.ClusterIP != corev1.ClusterIPNone {
				r.problem(k.at(svc, "spec.clusterIP"), "expected None: the StatefulSet's stable pod names come from a headless Service")
			}
			if !svc.Spec.PublishNotReadyAddresses {
				r.problem(k.at(svc, "spec.publishNotReadyAddresses"), "expected true: a pod is ready only once there is a leader, and there is none until members resolve each other")
			}
			if !matches(svc.Spec.Selector, labels) {
				r.problem(k.at(svc, "spec.selector"), "expected it to select the StatefulSet's pods %v", labels)
			}
			if !targets(svc, "peer", peerPort) {
				r.problem(k.at(svc, "spec.ports"), "expected a port to the peer port %d", peerPort)
			}
			continue
		}
		if matches(svc.Spec.Selector, labels) && targets(svc, "client", clientPort) {
			client = true
		}
	}
	if !headless {
		r.problem(k.at(sts, "spec.serviceName"), "expected a headless Service named %q among the manifests", sts.Spec.ServiceName)
	}
	if !client {
		r.problem("k8s", "expected a Service selecting %v with a port to the client port %d", labels, clientPort)
	}
}

func checkPDB(r *Report, k *K8s, sts *appsv1.StatefulSet, replicas int) {
	if len(k.PDBs) != 1 {
		r.problem("k8s", "expected one PodDisruptionBudget, found %d", len(k.PDBs))
		return
	}
	p := k.PDBs[0]
	if p.Spec.Selector == nil || !matches(p.Spec.Selector.MatchLabels, sts.Spec.Template.Labels) {
		r.problem(k.at(p, "spec.selector"), "expected it to select the StatefulSet's pods %v", sts.Spec.Template.Labels)
	}
	mu := p.Spec.MaxUnavailable
	if mu == nil || mu.Type != intstr.Int || mu.IntVal != 1 {
		r.problem(k.at(p, "spec.maxUnavailable"), "expected 1 (one member down at a time), found %v", mu)
		return
	}
	if replicas-int(mu.IntVal) < replicas/2+1 {
		r.problem(k.at(p, "spec.maxUnavailable"), "%d of %d members unavailable leaves no quorum", mu.IntVal, replicas)
	}
}
